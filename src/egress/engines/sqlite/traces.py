"""Trace contexts on SQLite (``TraceContexts``): the W3C contexts some messages carry from their source
event, in ``log_traces`` (by stream, partition, offset) and ``outbox_traces`` (by consumer, partition,
seq), written in the commit's transaction, deleted with the log batches and outbox messages they
belong to. Empty unless a run traced: a commit carrying no context writes nothing here."""

from __future__ import annotations

from egress.engines.protocols import EpochCommit
from egress.engines.sqlite.connection import SqliteConnection

LOG_TRACES_RECHECK = 1.0
"""Seconds between looks for a first stored log context (the engine clock's monotonic time; a cost bound)."""


class SqliteTraces(SqliteConnection):
    """:meth:`read_log_traces`, :meth:`read_outbox_traces`, and the commit's part (:meth:`_apply_traces`)."""

    async def read_log_traces(self, stream: str, partition: int, first: int, end: int) -> dict[int, str]:
        if not self._log_traced and self._clock.monotonic() < self._log_checked + LOG_TRACES_RECHECK:
            return {}  # none stored as of the last look: no database call per read
        return await self._read_call(self._read_log_traces_sync, stream, partition, first, end)

    def _read_log_traces_sync(self, stream: str, partition: int, first: int, end: int) -> dict[int, str]:
        assert self._db is not None
        if not self._log_traced:
            self._log_checked = self._clock.monotonic()
            if self._db.execute("SELECT 1 FROM log_traces LIMIT 1").fetchone() is None:
                return {}
            self._log_traced = True
        return {int(offset): str(context) for offset, context in self._db.execute(
            "SELECT offset, context FROM log_traces WHERE stream = ? AND partition = ? AND offset >= ? AND offset < ?",
            (stream, partition, first, end))}

    # Whether log contexts may be stored: until some are, a read looks (one query) at most every
    # LOG_TRACES_RECHECK seconds (another process of --processes may store the first); this engine's
    # own commit of one sets it at once.
    _log_traced = False
    _log_checked = float("-inf")

    async def read_outbox_traces(self, consumer: str, partition: int, after_seq: int) -> dict[int, str]:
        return await self._read_call(self._read_outbox_traces_sync, consumer, partition, after_seq)

    def _read_outbox_traces_sync(self, consumer: str, partition: int, after_seq: int) -> dict[int, str]:
        assert self._db is not None
        return {int(seq): str(context) for seq, context in self._db.execute(
            "SELECT seq, context FROM outbox_traces WHERE consumer = ? AND partition = ? AND seq > ?",
            (consumer, partition, after_seq))}

    def _apply_traces(self, commit: EpochCommit, appended: dict[tuple[str, int], int]) -> None:
        """Store ``commit``'s contexts inside its transaction; ``appended`` holds each log partition's
        end after the commit's appends (the offset of an append counts back from it). The outbox
        trim deletes the contexts of the outbox messages trimmed."""
        db = self._db
        assert db is not None
        if commit.log_traces:
            counts: dict[tuple[str, int], int] = {}
            for stream, partition, *_ in commit.log_appends:
                counts[(stream, partition)] = counts.get((stream, partition), 0) + 1
            next_offset = {slot: appended[slot] - count for slot, count in counts.items()}
            rows = []
            for index, (stream, partition, *_) in enumerate(commit.log_appends):
                offset = next_offset[(stream, partition)]
                next_offset[(stream, partition)] = offset + 1
                context = commit.log_traces.get(index)
                if context is not None:
                    rows.append((stream, partition, offset, context))
            db.executemany("INSERT OR REPLACE INTO log_traces (stream, partition, offset, context) "
                           "VALUES (?, ?, ?, ?)", rows)
            self._log_traced = True
        if commit.outbox_traces:
            db.executemany("INSERT OR REPLACE INTO outbox_traces (consumer, partition, seq, context) VALUES "
                           "(?, ?, ?, ?)", [(commit.consumer, commit.partition, seq, context)
                                            for seq, context in commit.outbox_traces.items()])
        if commit.outbox_acknowledged_seq is not None and (commit.outbox_traces or self._outbox_traced()):
            db.execute("DELETE FROM outbox_traces WHERE consumer = ? AND partition = ? AND seq <= ?",
                       (commit.consumer, commit.partition, commit.outbox_acknowledged_seq))
        if commit.outbox_traces:
            self._traced_outbox = True

    def _outbox_traced(self) -> bool:
        """Whether outbox contexts may be stored (then outbox trims delete theirs): looked up once, then
        known from this engine's own commits (another process's first context: at its own trims)."""
        if self._traced_outbox is None:
            assert self._db is not None
            self._traced_outbox = self._db.execute("SELECT 1 FROM outbox_traces LIMIT 1").fetchone() is not None
        return self._traced_outbox

    _traced_outbox: bool | None = None  # unknown until the first commit asks (_outbox_traced)
