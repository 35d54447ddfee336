"""The committing half of ``CheckpointStore`` on SQLite: each :class:`EpochCommit` is one
transaction (positions, log appends, outbox, sink progress, state and timers land together or not
at all), and commits queued together share one (group commit)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from egress.engines.protocols import EpochCommit, FencedError, OutboxMessage
from egress.engines.sqlite.appends import SqliteAppends
from egress.engines.sqlite.log import FRESH_CHUNKS
from egress.engines.sqlite.ownership import SqliteOwnership
from egress.errors import RowEncodingError
from egress.line_chunks import ChunkReference, LineChunk, pack_chunk, pack_reference
from egress.rows import first_unstorable_row_error, pack_batch


class SqliteCommits(SqliteAppends, SqliteOwnership):
    """:meth:`commit`: fenced by the lease (:class:`SqliteOwnership`), appending to the log
    (:class:`SqliteLog`) and telling the appends watch of its own appends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._queue_lock = threading.Lock()
        self._queued: list[tuple[EpochCommit, asyncio.Future[None]]] = []
        self._draining = False
        # Chunks of lines of the transaction in progress by id() of their stored blob (alive in the
        # transaction's records): a committed one is kept as the object (SqliteLog._fresh_chunks).
        self._pending_chunks: dict[int, LineChunk] = {}

    async def commit(self, commit: EpochCommit) -> None:
        # Group commit: commits that queue while the database thread is busy (several partition
        # jobs and source readers finishing epochs together) are applied in one transaction, each
        # inside its own savepoint with its own fence check, and made durable by one fsync.
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._queue_lock:
            self._queued.append((commit, done))
            start, self._draining = not self._draining, True
        if start:
            self._executor.submit(self._drain, loop)
        await done

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the database thread: apply queued commits, a group at a time, until none is queued."""
        while True:
            with self._queue_lock:
                group, self._queued = self._queued, []
                if not group:
                    self._draining = False
                    return
            self._pending_chunks.clear()  # a transaction that failed left its own
            try:
                outcomes = self._commit_group_sync([commit for commit, _ in group])
            except BaseException as error:  # every committer must hear of it, none may hang
                outcomes = [self._storage_error(error)] * len(group)
            loop.call_soon_threadsafe(_settle, [done for _, done in group], outcomes)

    def _commit_group_sync(self, commits: list[EpochCommit]) -> list[BaseException | None]:
        """Apply ``commits`` in one transaction; each one's outcome (``None``: applied). A commit
        refused on its own (stale generation, unstorable row) is rolled back to its savepoint alone."""
        if len(commits) == 1:
            return [self._commit_alone(commits[0])]
        db = self._db
        assert db is not None
        outcomes: list[BaseException | None] = []
        offsets: dict[tuple[str, int], int] = {}
        applied: list[tuple[str, int, int, int, bytes]] = []
        try:
            with self._transaction():
                for commit in commits:
                    db.execute("SAVEPOINT epoch_commit")
                    try:
                        appended, records = self._apply(commit, offsets)
                    except (FencedError, RowEncodingError) as refused:
                        db.execute("ROLLBACK TO epoch_commit")
                        outcomes.append(refused)
                    else:
                        offsets.update(appended)
                        applied.extend(records)
                        outcomes.append(None)
                    db.execute("RELEASE epoch_commit")
        except Exception:  # not one commit's refusal (e.g. the disk): each alone, with its own outcome
            return [self._commit_alone(commit) for commit in commits]
        self._published(offsets, applied)
        return outcomes

    def _commit_alone(self, commit: EpochCommit) -> BaseException | None:
        try:
            self._commit_sync(commit)
        except Exception as error:  # handed to the committer's future
            return self._storage_error(error)
        return None

    def _commit_sync(self, commit: EpochCommit) -> None:
        with self._transaction():
            appended, records = self._apply(commit, {})
        self._published(appended, records)

    def _published(self, appended: dict[tuple[str, int], int], records: list[tuple[str, int, int, int, bytes]]) -> None:
        """After a transaction is durable (``appended``: each slot's new end; ``records``: the log
        batches stored, in the order written). Unshared, its end offsets and log batches become
        visible to readers in this process. Shared, neither is kept (another process may append
        next); the appends watch counts the slots and start offsets appended as this process's own."""
        if self.shared:
            if self._appends_watch is not None:
                starts: dict[tuple[str, int], int] = {}
                for stream, partition, offset, _, _ in records:
                    starts.setdefault((stream, partition), offset)  # a group's commits continue each other
                self._appends_watch.own(starts, appended)
            return
        fresh, pending = self._fresh_chunks, self._pending_chunks
        for record in records:
            self._tail.add(*record)
            chunk = pending.get(id(record[4])) if pending else None
            if chunk is not None:
                fresh[record[:3]] = chunk
                while len(fresh) > FRESH_CHUNKS:
                    del fresh[next(iter(fresh))]
        pending.clear()
        self._end_offsets.update(appended)

    def _apply(self, commit: EpochCommit, offsets: dict[tuple[str, int], int]
               ) -> tuple[dict[tuple[str, int], int], list[tuple[str, int, int, int, bytes]]]:
        """Write ``commit`` inside the open transaction, after its fence check (:class:`FencedError`
        unless its lease is live at its generation). Log appends continue ``offsets`` (the ends earlier
        commits of the same transaction reached) or the durable end offsets; shared, always the
        ends the database holds inside this transaction. Returns the new end offsets and the log
        batches stored, ``(stream, partition, offset, count, messages)``."""
        db = self._db
        assert db is not None
        c, p = commit.consumer, commit.partition
        held = self._held_sync(c, p)  # the fence: the lease live and still at this commit's generation
        if held is None or held[0] != commit.generation:
            now = "lapsed or released" if held is None else f"now {held[0]}"
            raise FencedError(f"{c} partition {p}: generation {commit.generation} is stale ({now})")
        db.executemany(
            "INSERT INTO positions (consumer, partition, stream, stream_partition, offset) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET offset = excluded.offset",
            [(c, p, s, sp, off) for (s, sp), off in commit.input_positions.items()],
        )
        appended, records = self._apply_log_appends(commit, offsets) if commit.log_appends else ({}, [])
        if commit.log_chunks:
            self._apply_log_chunks(commit, offsets, appended, records)
        self._apply_outbox(commit)
        self._apply_state(commit)
        self._apply_timers(commit)
        return appended, records

    def _apply_log_appends(self, commit: EpochCommit, offsets: dict[tuple[str, int], int]
                           ) -> tuple[dict[tuple[str, int], int], list[tuple[str, int, int, int, bytes]]]:
        """Store ``commit``'s log appends as one batch per ``(stream, partition)`` (:meth:`_apply`)."""
        db = self._db
        assert db is not None
        appended: dict[tuple[str, int], int] = {}
        records: list[tuple[str, int, int, int, bytes]] = []
        batches: dict[tuple[str, int], list[tuple[bytes, bytes, float | None, dict[str, Any]]]] = {}
        for stream, partition, message_id, key, ts, values in commit.log_appends:
            batch = batches.get((stream, partition))
            if batch is None:
                batch = batches[(stream, partition)] = []
            batch.append((message_id, key, ts, values))
        try:
            for (stream, partition), batch in batches.items():
                # Shared, from the database inside this write transaction (which holds what
                # earlier commits of the group wrote), never from what this process carried.
                offset = None if self.shared else offsets.get((stream, partition))
                if offset is None:
                    offset = self._end_offset_sync(stream, partition)
                appended[(stream, partition)] = offset + len(batch)
                records.append((stream, partition, offset, len(batch), pack_batch(batch)))
        except TypeError:
            raise first_unstorable_row_error(commit.origin, commit.log_rows()) from None
        db.executemany(
            "INSERT INTO log_batches (stream, partition, offset, count, messages) VALUES (?, ?, ?, ?, ?)",
            records)
        return appended, records

    def _apply_log_chunks(self, commit: EpochCommit, offsets: dict[tuple[str, int], int],
                          appended: dict[tuple[str, int], int],
                          records: list[tuple[str, int, int, int, bytes]]) -> None:
        """Store ``commit``'s chunks of lines, one log row each, after its row appends (``appended``,
        ``records``: what they wrote, extended here)."""
        db = self._db
        assert db is not None
        rows: list[tuple[str, int, int, int, bytes]] = []
        for stream, partition, chunk in commit.log_chunks:
            slot = (stream, partition)
            offset = appended.get(slot)
            if offset is None and not self.shared:
                offset = offsets.get(slot)
            if offset is None:
                offset = self._end_offset_sync(stream, partition)
            appended[slot] = offset + chunk.count
            blob = pack_chunk(chunk)
            rows.append((stream, partition, offset, chunk.count, blob))
            self._pending_chunks[id(blob)] = chunk  # kept as the object once committed (_published)
        db.executemany("INSERT INTO log_batches (stream, partition, offset, count, messages) VALUES (?, ?, ?, ?, ?)",
                       rows)
        records.extend(rows)

    def _apply_outbox(self, commit: EpochCommit) -> None:
        """Store ``commit``'s outbox, its sinks' progress and what every sink has persisted."""
        db = self._db
        assert db is not None
        c, p = commit.consumer, commit.partition
        if commit.outbox:
            try:
                outbox = [(c, p, batch[0][0], batch[-1][0], stream, len(batch), pack_batch(batch))
                          for stream, batch in outbox_batches(commit.outbox).items()]
            except TypeError:
                raise first_unstorable_row_error(commit.origin, commit.outbox_rows()) from None
            db.executemany(
                "INSERT INTO outbox_batches (consumer, partition, first_seq, last_seq, stream, count, messages) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", outbox)
        if commit.outbox_chunks:
            db.executemany(
                "INSERT INTO outbox_batches (consumer, partition, first_seq, last_seq, stream, count, messages) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(c, p, o.first_seq, o.first_seq + o.chunk.count - 1, o.stream, o.chunk.count, pack_reference(
                    ChunkReference(o.log_stream, o.log_partition, o.log_offset, o.chunk.count, o.id_suffix)))
                 for o in commit.outbox_chunks])
        db.executemany(
            "INSERT INTO sink_progress (consumer, partition, sink, producer_id, max_persisted_message_id, "
            "max_persisted_seq_no, sink_state) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
            "producer_id = excluded.producer_id, max_persisted_message_id = excluded.max_persisted_message_id, "
            "max_persisted_seq_no = excluded.max_persisted_seq_no, sink_state = excluded.sink_state",
            [(c, p, sink, s.producer_id, s.max_persisted_message_id, s.max_persisted_seq_no, s.sink_state)
             for sink, s in commit.sink_progress.items()],
        )
        if commit.outbox_acknowledged_seq is not None:
            acknowledged = commit.outbox_acknowledged_seq
            db.execute("DELETE FROM outbox_batches WHERE consumer = ? AND partition = ? AND first_seq <= ? "
                       "AND last_seq <= ?", (c, p, acknowledged, acknowledged))
            db.execute("INSERT INTO outbox_acknowledged (consumer, partition, seq) VALUES (?, ?, ?) "
                       "ON CONFLICT DO UPDATE SET seq = excluded.seq", (c, p, acknowledged))

    def _apply_state(self, commit: EpochCommit) -> None:
        """Store ``commit``'s internal and external state writes (``None``: delete the key)."""
        db = self._db
        assert db is not None
        c = commit.consumer
        if commit.state_writes:
            db.executemany("DELETE FROM state WHERE consumer = ? AND name = ? AND key = ?",
                           [(c, name, key) for (name, key), value in commit.state_writes.items() if value is None])
            db.executemany(
                "INSERT INTO state (consumer, name, key, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT DO UPDATE SET value = excluded.value",
                [(c, name, key, value) for (name, key), value in commit.state_writes.items() if value is not None],
            )
        if commit.external_state_writes:
            writes = commit.external_state_writes.items()
            db.executemany("DELETE FROM external_state WHERE name = ? AND key = ?",
                           [(name, key) for (name, key), value in writes if value is None])
            db.executemany(
                "INSERT INTO external_state (name, key, row) VALUES (?, ?, ?) "
                "ON CONFLICT DO UPDATE SET row = excluded.row",
                [(name, key, value) for (name, key), value in writes if value is not None],
            )

    def _apply_timers(self, commit: EpochCommit) -> None:
        """Store ``commit``'s timer deletions, then its timers set, and its watermark."""
        db = self._db
        assert db is not None
        c, p = commit.consumer, commit.partition
        if commit.timers_deleted:
            db.executemany(
                "DELETE FROM timers WHERE consumer = ? AND partition = ? AND key = ? AND trigger_ts = ? AND domain = ?",
                [(c, p, key, ts, _domain(rest)) for key, ts, *rest in commit.timers_deleted],
            )
        if commit.timers_set:
            db.executemany(
                "INSERT OR IGNORE INTO timers (consumer, partition, key, trigger_ts, domain) VALUES (?, ?, ?, ?, ?)",
                [(c, p, key, ts, _domain(rest)) for key, ts, *rest in commit.timers_set],
            )
        if commit.watermark is not None:
            db.execute(
                "INSERT INTO watermarks (consumer, partition, watermark) VALUES (?, ?, ?) "
                "ON CONFLICT DO UPDATE SET watermark = excluded.watermark",
                (c, p, commit.watermark),
            )


def _settle(futures: list[asyncio.Future[None]], outcomes: list[BaseException | None]) -> None:
    """On the event loop: tell each committer its commit's outcome (unless it stopped waiting)."""
    for future, outcome in zip(futures, outcomes, strict=True):
        if future.done():
            continue
        if outcome is None:
            future.set_result(None)
        else:
            future.set_exception(outcome)



def outbox_batches(messages: list[OutboxMessage]) -> dict[str, list[tuple[Any, ...]]]:
    """A commit's outbox as one batch per stream, in seq order: ``(seq, message id, key, event
    timestamp, row)`` each."""
    batches: dict[str, list[tuple[Any, ...]]] = {}
    for seq, stream, message_id, key, ts, row in messages:
        batch = batches.get(stream)
        if batch is None:
            batch = batches[stream] = []
        batch.append((seq, message_id, key, ts, row))
    return batches



def _domain(rest: list[str]) -> str:
    """A timer's domain; ``(key, trigger)`` pairs (the first form of the hook) mean processing time."""
    return rest[0] if rest else "processing"

