"""Which file a committed source position belongs to: its inode and a fingerprint of its first bytes.

A file source commits, with its record position, the :class:`FileIdentity` of the file it read
(as its ``source state``, see ``egress.connectors.base.ResumableSource``). On a restart the file at
the path is compared with it before anything is read: another inode (the file was replaced, e.g.
by ``mv`` or an editor's save), or first bytes that differ or are no longer all there (rewritten in
place or truncated), means the committed record number no longer points into the same rows.

The fingerprint covers the first :data:`FINGERPRINT_BYTES` bytes, or the whole file when it was
shorter, and records how many bytes it covers, so a file that grew by appends still matches. What
it cannot see: a file truncated and rewritten with the same first bytes on the same inode (for a
CSV, the same header and first rows); :func:`check_record_count` then still catches a file with
fewer records than were already read.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import orjson

from egress.errors import SourceChangedError

FINGERPRINT_BYTES = 4096


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """``inode`` (``st_ino``), ``fingerprint`` (BLAKE2b-128 hex of the first ``length`` bytes)."""

    inode: int
    length: int
    fingerprint: str

    @classmethod
    def of(cls, descriptor: int, length: int = FINGERPRINT_BYTES) -> FileIdentity:
        """The identity of the open file ``descriptor`` over its first ``length`` bytes (fewer when
        the file is shorter); reads with ``pread``, so the file position is unchanged."""
        head = os.pread(descriptor, length, 0)
        return cls(os.fstat(descriptor).st_ino, len(head), hashlib.blake2b(head, digest_size=16).hexdigest())

    def encode(self) -> bytes:
        return orjson.dumps({"inode": self.inode, "length": self.length, "fingerprint": self.fingerprint})

    @classmethod
    def decode(cls, data: bytes) -> FileIdentity:
        document = orjson.loads(data)
        return cls(int(document["inode"]), int(document["length"]), str(document["fingerprint"]))

    def change(self, descriptor: int) -> str | None:
        """How the open file ``descriptor`` differs from the file this identity was taken of
        (``"replaced"`` / ``"rewritten or truncated"``), ``None`` when it is the same file."""
        if os.fstat(descriptor).st_ino != self.inode:
            return "replaced (another inode)"
        if FileIdentity.of(descriptor, self.length) != self:
            return "rewritten or truncated (its first bytes differ)"
        return None


START_OVER = ("read every source from the start in new committed state: a new state directory (--state-dir), in a "
              "cluster another pipeline name or `egress state delete`")
"""The one way on that works whatever a source's committed position is (docs/sources.md)."""

CHANGED_FILE_FIX = ("put back the very file it read (the same inode: `mv FILE.bak FILE` after `sed -i.bak`; a copy is "
                    f"another file), or {START_OVER}")
"""What to do about a file that is not the one a committed position was read from. Neither
``on_bad_record`` nor ``follow: true`` resumes it: the first is about records, the second keeps
another kind of position (a source that reads rotated or rewritten files needs it from its first run)."""


def changed_error(file: str, source_id: str, position: int, how: str) -> SourceChangedError:
    """The error for a one-shot file source whose file is not the one its committed position was
    read from: names the file, what changed, the committed position and the fixes."""
    return SourceChangedError(
        f"{file}: source {source_id!r} already read {position:,} record(s) of this path, but the file was {how} "
        f"since; refusing to resume by record number, which would skip new rows: {CHANGED_FILE_FIX}")


def check_record_count(file: str, source_id: str, start_position: int, count: int) -> None:
    """Raise :func:`changed_error` when the file holds ``count`` records, fewer than the
    ``start_position`` already committed (it was shortened)."""
    if count < start_position:
        raise changed_error(file, source_id, start_position, f"shortened (it now holds {count:,} record(s))")
