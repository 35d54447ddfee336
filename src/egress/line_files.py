"""Append-only files of newline-terminated lines, each append durable before it returns.

Used by the dead-letter files of the HTTP sinks, their redrive records, and the Firehose sink's
error output. A file only ever holds complete lines, or complete lines and one torn last line left
by a crash (power loss, a full disk) in the middle of an append:

- :meth:`LineFile.append` writes all its lines with one ``write`` (``O_APPEND``), then ``fsync``s
  the file (and its folder when it created the file), under an exclusive ``flock`` of the file, so
  appends of several writers (sink instances of one run, or several processes) never interleave.
  Before writing, it cuts a torn last line off (``ftruncate`` to the end of the last complete
  line), and a failed write is cut back the same way, so a torn line never stays in the middle.
- :func:`read_lines` returns the complete lines only: a torn last line, and a line another writer
  is appending at that moment, are not lines yet.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from egress.errors import EgressError

FILE_MODE = 0o600  # the lines hold payloads: readable by the owner only
_TAIL_CHUNK = 64 * 1024


class LineFileBusy(EgressError):
    """Another process holds :meth:`LineFile.exclusively` on the file."""


class LineFile:
    """The append side of one line file at ``path`` (created with mode 0600 on first append).

    Stateless between calls: each append opens the file, locks it, repairs its tail, writes, syncs
    and closes it, unless :meth:`exclusively` holds it open. Raises ``OSError`` (with the path as
    ``filename``) when it cannot.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._held: int | None = None  # the descriptor while exclusively() holds the file

    def append(self, lines: bytes) -> None:
        """Append ``lines`` (complete lines, each ending in ``\\n``) and make them durable."""
        if not lines:
            return
        if not lines.endswith(b"\n"):
            raise ValueError("LineFile.append takes complete lines, each ending in a newline")
        if self._held is not None:
            _append_locked(self._held, lines)
            return
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            _append_locked(fd, lines)
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def exclusively(self) -> Iterator[None]:
        """Hold the file open and locked until the block ends, so that no other process appends
        meanwhile. Raises :class:`LineFileBusy` at once when another process holds it."""
        fd = self._open()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LineFileBusy(f"{self.path} is held by another process") from None
            self._held = fd
            yield
        finally:
            self._held = None
            os.close(fd)

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
        try:
            return os.open(self.path, flags)
        except FileNotFoundError:
            pass
        fd = os.open(self.path, flags | os.O_CREAT, FILE_MODE)
        _sync_folder(self.path)  # the new file's name must survive a crash with its first lines
        return fd


def read_lines(path: str | Path) -> tuple[list[bytes], int]:
    """The complete lines of ``path`` (without their newlines) and the byte count of a torn last
    line after them (0 when there is none). Raises ``OSError`` (``FileNotFoundError`` when absent)."""
    data = Path(path).read_bytes()
    end = data.rfind(b"\n") + 1
    return data[:end].splitlines(), len(data) - end


def _append_locked(fd: int, lines: bytes) -> None:
    end = _complete_end(fd)
    if end != os.fstat(fd).st_size:
        os.ftruncate(fd, end)  # a torn line from a crash: it was never acknowledged, drop it
    try:
        view = memoryview(lines)
        while view:  # one write for a regular file; the loop only covers a short write
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, end)  # leave no part of these lines behind
        raise


def _complete_end(fd: int) -> int:
    """The offset just after the last newline of the file (0 when it has none)."""
    size = os.fstat(fd).st_size
    position = size
    while position > 0:
        start = max(0, position - _TAIL_CHUNK)
        chunk = os.pread(fd, position - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return 0


def _sync_folder(path: Path) -> None:
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["LineFile", "LineFileBusy", "read_lines"]
