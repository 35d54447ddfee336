"""Following files (``follow: true`` on ``csv`` and ``jsonl``): tail files as they grow, follow
rotation, pick up new files of a glob ``path``.

Every file the path (or glob) has matched gets a **file number** (0, 1, … in the order they were
first seen), the ``source partition`` of its records' message ids; a record's position is its record
number in its file. A file is known by its identity (inode and a fingerprint of its first bytes,
``identity.FileIdentity``), not by its name: a file renamed within the glob is the same file, a new
file at the path (rotation) or a file rewritten or truncated in place is a new file, read from its
start under a new number.

Each pass over the files reads, in file-number order (older files first), every complete line (one
record per line: a CSV record must not hold a newline inside quotes); a partial last line is left
until its newline arrives. A file that no longer matches (rotated away, deleted) is read to its end
through the descriptor still open, then dropped; a partial last line it still has then is never
completed, and is reported as a warning and not read. A dropped file found again later (renamed into
the pattern between a pass's glob and its open, so that pass saw another file at its path) is
recognised by its identity among the last :data:`DROPPED_KEPT` dropped and not read again. The state
committed with each batch is every file's number, identity, byte offset, record and line counts and
(CSV) header, so a restart resumes each file at its committed byte; a file rotated away while egress
was down is found again in its folder by its inode (``app.log`` → ``app.log.1``) and read to its end
first. A single path also finds the files created *and* rotated away while egress was down: its
rotated siblings (``app.log.*``, not ``.gz``) that are none of the committed files, not one read to
its end and dropped lately (the state keeps the last :data:`DROPPED_KEPT` identities), and that were
modified after the newest modification the state has seen (``seen_mtime_ns``, so a rotated file of
before is not read again), oldest first.

With ``readers: N`` (a glob ``path`` only) the files are shared among N readers, each its own unit
with its own committed state: reader 0 deals each new file to the reader with the fewest files
(then bytes) and commits the deal; the others take a file once that committed deal gives it to
them (``egress.connectors.sources.shares``; by inode, not name, so a file renamed within the glob
stays with its reader). Reader ``k`` numbers its files ``k, k+N, k+2N, …``, so message ids never
collide between readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import glob
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from egress.connectors.base import SourceRecord
from egress.connectors.sources.bad_records import BadRecords, WithBadRecords
from egress.connectors.sources.identity import START_OVER, FileIdentity
from egress.connectors.sources.live import HeldFailure
from egress.connectors.sources.schema import CsvPlan, csv_plan, csv_row, data_error, json_row, timestamp_of
from egress.connectors.sources.shares import FileShares
from egress.connectors.sources.unread import estimate
from egress.errors import SourceChangedError, SourceDataError
from egress.spec import StreamSpec

READ_BYTES = 1 << 20
"""Bytes read from one file at once."""
IDLE_WAIT_MAX = 0.25
"""Seconds a pass that found nothing waits at most before the next: the wait :meth:`FollowedFiles.take`
is asked for (``live_poll_period``) doubles after each such pass up to this, and is asked for
again after a pass that read something. An idle followed glob then costs a pass (a glob, an
``fstat`` per file, a worker-thread hop) 4 times a second instead of 20; a line appended after a
quiet spell is read within this long."""
DROPPED_KEPT = 16
"""Identities of files read to their end and dropped that the state keeps: a rotated sibling with
one of them is not read again after a restart."""

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FollowedFile:
    """What is committed of one file: ``number`` (its source partition), the ``path`` it was last
    seen at, its identity, ``offset`` (bytes read: the start of the next line), ``records`` (the
    next record number), ``lines`` (lines read, for error messages) and the CSV ``header``."""

    number: int
    path: str
    inode: int
    length: int
    fingerprint: str
    offset: int = 0
    records: int = 0
    lines: int = 0
    header: list[str] | None = None

    @property
    def identity(self) -> FileIdentity:
        return FileIdentity(self.inode, self.length, self.fingerprint)


def has_magic(pattern: str) -> bool:
    """Whether ``pattern`` is a glob (``*``, ``?``, ``[``) rather than one path."""
    return glob.has_magic(pattern)


class FollowedFiles(HeldFailure, WithBadRecords):
    """A :class:`~egress.connectors.base.LiveSource` over the files ``path`` names (a path or a glob),
    ``kind`` ``csv`` or ``jsonl``, converting each line as the one-shot source of that kind does."""

    takes_ahead = True
    """Its reader reads the next batch while the batch before commits (``live.TakesAhead``)."""

    def __init__(self, kind: str, path: Path, parameters: Any, stream: StreamSpec, source_id: str,
                 bad_records: BadRecords) -> None:
        self.kind = kind
        self.bad_records = bad_records
        self.pattern = str(path)
        self.parameters = parameters
        self.stream = stream
        self.source_id = source_id
        self._files: dict[int, FollowedFile] = {}
        self._descriptors: dict[int, int] = {}
        self._next_number = 0
        self._share, self._readers = 0, 1  # this reader's share of the files (read_partition)
        self._shares = FileShares()
        self._position = 0
        self._until_caught_up = False
        self._nulls = frozenset(getattr(parameters, "null_values", ()))
        self._plans: dict[int, CsvPlan] = {}
        self._matched_paths: set[str] = set()
        self._seen_mtime_ns = 0  # the newest modification time of a file when lines were read from it
        self._dropped: list[FileIdentity] = []  # of the files dropped last
        self._idle_wait = 0.0  # what the last pass that found nothing waited (0: the last one read)

    def read_partition(self, index: int, count: int) -> None:
        """Follow only the files dealt to reader ``index`` of ``count``
        (``egress.connectors.base.PartitionedSource``; reader 0 deals), numbered ``index, index+count, …``."""
        self._share, self._readers = index, count
        self._shares = FileShares(index, count)
        self._next_number = index

    def deal_from(self, reader_state: Callable[[int], Awaitable[bytes]]) -> None:
        """``reader_state(k)`` loads reader ``k``'s committed source state: reader 0's holds the
        deals (``egress.connectors.base.DealtSource``)."""
        self._shares.deal_from(reader_state)

    # -- LiveSource --------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Records read over all files (the committed state holds each file's own position)."""
        return self._position

    @property
    def source_state(self) -> bytes:
        # orjson writes a dataclass as asdict() would, without its deep copy of every field: read
        # three times a pass, that copy was most of an idle reader's CPU.
        return orjson.dumps({"next_number": self._next_number,
                             "files": sorted(self._files.values(), key=lambda f: f.number),
                             "seen_mtime_ns": self._seen_mtime_ns,
                             "dropped": [[i.inode, i.length, i.fingerprint] for i in self._dropped],
                             **self._shares.state()})

    async def start(self, position: int, source_state: bytes, until_caught_up: bool) -> None:
        """Resume every committed file at its byte offset; with ``until_caught_up``, :meth:`take`
        returns ``None`` once a pass over the files finds no complete line left."""
        self._position = position
        self._until_caught_up = until_caught_up
        if source_state:
            self._restore(source_state, position)
        elif position > 0:
            raise self._read_without_follow()

    async def take(self, limit: int, wait: float) -> list[SourceRecord] | None:
        """The complete lines available now (up to ``limit`` records), or ``[]`` after a wait: ``wait``
        seconds after a pass that read something, doubling after each pass that found nothing up to
        :data:`IDLE_WAIT_MAX` (or ``wait``, if longer)."""
        self.raise_held()
        shares = self._shares
        await shares.refresh(self._clock.monotonic())
        before = self.source_state
        records = await asyncio.to_thread(self._pass, limit)
        if records or self.source_state != before:
            self._idle_wait = 0.0
            return records
        if self._until_caught_up and not shares.undealt:  # a file waiting for its deal is still to read
            return None
        self._idle_wait = min(max(wait, 2 * self._idle_wait), max(wait, IDLE_WAIT_MAX))
        await self._clock.sleep(self._idle_wait)
        return []

    def committed(self) -> None:
        """Nothing to do: the committed offsets are the state."""

    def unread_records(self) -> int | None:
        """An estimate (``egress.connectors.sources.unread``): the bytes after each followed file's
        offset (a partial last line included) times the records per byte read so far, over all files;
        ``None`` while bytes remain and no record was read yet. Files not seen yet are not counted."""
        remaining = records = read = 0
        for number, followed in list(self._files.items()):  # a copy: a pass may run on its thread
            descriptor = self._descriptors.get(number)
            if descriptor is None:
                continue
            try:
                size = os.fstat(descriptor).st_size
            except OSError:  # dropped meanwhile
                continue
            remaining += max(0, size - followed.offset)
            records, read = records + followed.records, read + followed.offset
        return estimate(remaining, records, read)

    async def close(self) -> None:
        for descriptor in self._descriptors.values():
            os.close(descriptor)
        self._descriptors.clear()

    # -- the files ---------------------------------------------------------------------------

    def _restore(self, source_state: bytes, position: int) -> None:
        document = orjson.loads(source_state)
        if "files" not in document:
            raise self._read_without_follow()
        self._next_number = int(document["next_number"])
        self._dropped = [FileIdentity(int(inode), int(length), str(fingerprint))
                         for inode, length, fingerprint in document.get("dropped", [])]
        for entry in document["files"]:
            followed = FollowedFile(**{**entry, "header": entry.get("header")})
            descriptor = self._reopen(followed)
            if descriptor is None:
                log.warning("%s: followed file %d (inode %d) is gone; its lines after byte %d were not read",
                            followed.path, followed.number, followed.inode, followed.offset)
                continue
            self._files[followed.number] = followed
            self._descriptors[followed.number] = descriptor
        self._shares.restore(document, [followed.inode for followed in self._files.values()])
        if "seen_mtime_ns" in document and not has_magic(self.pattern):
            self._seen_mtime_ns = int(document["seen_mtime_ns"])
            self._add_rotated_while_down()

    def _add_rotated_while_down(self) -> None:
        """Add the single path's rotated siblings (``PATH.*``) that are new since the committed
        state: not followed, not dropped lately, modified after :attr:`_seen_mtime_ns`; oldest first,
        so they are read before the file now at the path."""
        folder, name = os.path.split(self.pattern)
        known = {f.inode for f in self._files.values()}
        found: list[tuple[int, str]] = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder or "."):
                if not entry.name.startswith(name + ".") or entry.name.endswith(".gz") or entry.inode() in known:
                    continue
                stat = entry.stat()
                if entry.is_file() and stat.st_mtime_ns > self._seen_mtime_ns:
                    found.append((stat.st_mtime_ns, entry.path))
        for _, path in sorted(found):
            try:
                descriptor = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            if self._was_dropped(descriptor):
                os.close(descriptor)
                continue
            log.info("%s: read as rotated away while egress was down", path)
            self._add(path, descriptor)

    def _read_without_follow(self) -> SourceChangedError:
        return SourceChangedError(
            f"{self.pattern}: source {self.source_id!r} was read without follow: true; a followed source keeps "
            f"a position per file: run it without follow: true, as it was read, or {START_OVER}")

    def _reopen(self, followed: FollowedFile) -> int | None:
        """A descriptor of the committed file: at its path, or renamed within its folder (found by inode)."""
        candidates = [followed.path]
        folder = os.path.dirname(followed.path) or "."
        with contextlib.suppress(OSError):
            candidates += [entry.path for entry in os.scandir(folder) if entry.inode() == followed.inode]
        for candidate in candidates:
            try:
                descriptor = os.open(candidate, os.O_RDONLY)
            except OSError:
                continue
            if followed.identity.change(descriptor) is None:
                followed.path = candidate
                return descriptor
            os.close(descriptor)
        return None

    def _scan(self) -> None:
        """Match the pattern: new files get a number; a file rewritten in place starts again under a
        new number; files no longer matched keep their descriptor until read to the end."""
        paths = sorted(glob.glob(self.pattern)) if has_magic(self.pattern) else [self.pattern]
        self._matched_paths = set(paths)
        by_inode = {f.inode: f for f in self._files.values()}
        opened: list[tuple[str, int, os.stat_result]] = []
        for path in paths:
            try:
                descriptor = os.open(path, os.O_RDONLY)
            except OSError:
                continue  # not there (yet), or gone since the glob
            opened.append((path, descriptor, os.fstat(descriptor)))
        self._shares.begin({stat.st_ino: stat.st_size for _, _, stat in opened})
        for path, descriptor, stat in opened:
            known = by_inode.get(stat.st_ino)
            if known is not None and known.identity.change(descriptor) is None and stat.st_size >= known.offset:
                known.path = path
                os.close(descriptor)
                continue
            if known is None and not self._shares.mine(stat.st_ino, stat.st_size):
                os.close(descriptor)  # another reader's, or not dealt yet
                continue
            if known is not None:  # same inode, other first bytes or shorter: rewritten or truncated
                self._drop(known.number)
            elif self._was_dropped(descriptor):
                # Read to its end already: renamed into the pattern after an earlier pass's glob and
                # before its open, that pass took it for rotated away (its path held another file).
                os.close(descriptor)
                continue
            self._add(path, descriptor)

    def _was_dropped(self, descriptor: int) -> bool:
        """Whether ``descriptor``'s file is one read to its end and dropped lately (same identity)."""
        return any(dropped.change(descriptor) is None for dropped in self._dropped)

    def _add(self, path: str, descriptor: int) -> None:
        identity = FileIdentity.of(descriptor)
        followed = FollowedFile(self._next_number, path, identity.inode, identity.length, identity.fingerprint)
        self._next_number += self._readers
        self._files[followed.number] = followed
        self._descriptors[followed.number] = descriptor

    def _drop(self, number: int) -> None:
        dropped = self._files.pop(number)
        self._dropped = [*self._dropped, dropped.identity][-DROPPED_KEPT:]
        self._plans.pop(number, None)
        os.close(self._descriptors.pop(number))

    def _matched(self, followed: FollowedFile) -> bool:
        """Whether the file is still the one at a path the pattern matched in this pass's scan."""
        try:
            return followed.path in self._matched_paths and os.stat(followed.path).st_ino == followed.inode
        except OSError:
            return False

    def _pass(self, limit: int) -> list[SourceRecord]:
        """One pass: scan, then read complete lines in file-number order, up to ``limit`` records."""
        self._scan()
        records: list[SourceRecord] = []
        try:
            for number in sorted(self._files):
                followed = self._files[number]
                matched = self._matched(followed)
                self._read(followed, self._descriptors[number], limit - len(records), records)
                if len(records) >= limit:
                    break
                if not matched:  # rotated away or deleted, and read to its end: done with it
                    size = os.fstat(self._descriptors[number]).st_size
                    if size > followed.offset:
                        log.warning("%s: followed file %d was rotated away with an incomplete last line "
                                    "(%d bytes after its last newline, not read)", followed.path, number,
                                    size - followed.offset)
                    self._drop(number)
        except SourceDataError as failure:  # the records before it are committed first
            records = self.taken_before(records, failure)
        self._position += len(records)
        return records

    def _read(self, followed: FollowedFile, descriptor: int, limit: int, records: list[SourceRecord]) -> None:
        """Append up to ``limit`` records from the complete lines after ``followed.offset``."""
        while limit > 0:
            data = os.pread(descriptor, READ_BYTES, followed.offset)
            end = data.rfind(b"\n")
            if end < 0:
                return
            self._seen_mtime_ns = max(self._seen_mtime_ns, os.fstat(descriptor).st_mtime_ns)
            for line in data[:end + 1].splitlines(keepends=True):
                followed.offset += len(line)
                followed.lines += 1
                try:
                    record = self._record(followed, line)
                except SourceDataError:  # the line is read again (its failure again) by the next run
                    followed.offset -= len(line)
                    followed.lines -= 1
                    raise
                if record is not None:
                    records.append(record)
                    followed.records += 1
                    limit -= 1
                    if limit == 0:
                        return

    def _record(self, followed: FollowedFile, line: bytes) -> SourceRecord | None:
        """The record of one complete line (``None`` for a blank line, the CSV header, or a bad record
        that ``on_bad_record`` drops: it still takes its record number)."""
        try:
            return self._convert(followed, line)
        except SourceDataError as error:
            if followed.header is None and self.kind == "csv":
                raise  # a header without the schema's columns is no bad record: the whole file is unreadable
            self.bad_records.handle(error, followed.path, followed.records, line)
            followed.records += 1
            return None

    def _convert(self, followed: FollowedFile, line: bytes) -> SourceRecord | None:
        file, number = followed.path, followed.lines
        try:
            text = line.decode()
        except UnicodeDecodeError as error:
            raise data_error(file, number, None, f"not UTF-8 ({error})") from None
        if number == 1:
            text = text.removeprefix("\ufeff")  # a byte order mark (as files.TEXT_ENCODING drops it)
        if not text.strip():
            return None
        timestamp_column = self.parameters.timestamp_column
        if self.kind == "jsonl":
            row = json_row(text, self.stream.columns, f"{file}:{number}")
        else:
            try:
                fields = next(csv.reader([text.rstrip("\r\n")], delimiter=self.parameters.delimiter))
            except csv.Error as error:
                raise SourceDataError(f"{file}:{number}: not a CSV record ({error})") from None
            plan = self._plans.get(followed.number)
            if plan is None:
                if followed.header is None:  # this line is the header: it must name every schema column
                    self._plans[followed.number] = csv_plan(self.stream, fields, file)
                    followed.header = fields
                    return None
                plan = self._plans[followed.number] = csv_plan(self.stream, followed.header, file)
            row = csv_row(fields, plan, self._nulls, file, number)
        return SourceRecord(followed.records, row, timestamp_of(row, self.stream, timestamp_column, file, number),
                            followed.number)
