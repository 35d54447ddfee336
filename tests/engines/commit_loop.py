"""The child of the SIGKILL test: commits numbered epochs on an engine until it is killed.

``python -m tests.engines.commit_loop ENGINE DIRECTORY`` opens engine ``ENGINE`` (a name in
``ENGINES``) on ``DIRECTORY``, takes ownership of ``CONSUMER`` partition 0, continues after the
committed position and commits :func:`numbered_commit` ``n`` for n = position + 1, + 2, … After
each commit returns it prints ``n`` on stdout (flushed): the parent's signal that ``n`` is
committed. :func:`expected_after` is what the engine must hold once ``n`` is the last commit.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from egress.engines import Engine, EpochCommit, KeyedState, LogMessage, OutboxMessage, SinkProgress
from egress.keys import encode_key
from tests.engines.engines import open_engine

CONSUMER = "crash"
INPUT = ("in", 0)
MESSAGES = 200  # log appends and outbox messages per commit: enough work for a kill to land inside one
TABLE = "crash_external"


def _key(n: int) -> bytes:
    return encode_key([n])


def _log_message(n: int, i: int, offset: int) -> LogMessage:
    return LogMessage("out", 0, offset, f"{n}:{i}".encode(), _key(n), float(n), {"n": n, "i": i})


def _outbox(n: int) -> list[OutboxMessage]:
    first = (n - 1) * MESSAGES + 1
    return [OutboxMessage(first + i, "requests", f"{n}:{i}".encode(), _key(n), float(n), {"n": n, "i": i})
            for i in range(MESSAGES)]


def _progress(n: int) -> SinkProgress:
    """Commit ``n`` reports the sink persisted everything of the commits before it."""
    return SinkProgress("", f"{n - 1}".encode(), (n - 1) * MESSAGES, f"state {n}".encode())


def numbered_commit(generation: int, n: int) -> EpochCommit:
    """Commit ``n`` (from 1) of ``CONSUMER``: each kind of change, all derived from ``n``."""
    return EpochCommit(
        CONSUMER, 0, generation, {INPUT: n},
        log_appends=[(m.stream, m.partition, m.message_id, m.key, m.event_timestamp, m.row)
                     for m in (_log_message(n, i, 0) for i in range(MESSAGES))],
        outbox=_outbox(n),
        sink_progress={"http": _progress(n)},
        outbox_acknowledged_seq=(n - 1) * MESSAGES,
        state_writes={("commits", _key(n)): b"%d" % n, ("last", b"[]"): b"%d" % n},
        external_state_writes={(TABLE, _key(n)): b"%d" % n},
        timers_set=[(_key(n), float(n), "processing")],
        timers_deleted=[(_key(n - 1), float(n - 1), "processing")] if n > 1 else [],
        watermark=float(n),
    )


def expected_after(n: int) -> dict[str, Any]:
    """What :func:`observed` must return once commits 1 … ``n`` (and no later one) are committed."""
    return {
        "position": n,
        "log": [_log_message(c, i, (c - 1) * MESSAGES + i) for c in range(1, n + 1) for i in range(MESSAGES)],
        "outbox": _outbox(n) if n else [],
        "next_seq": n * MESSAGES + 1,
        "progress": _progress(n) if n else SinkProgress(),
        "keyed": KeyedState(
            {"commits": {_key(c): b"%d" % c for c in range(1, n + 1)}, "last": {b"[]": b"%d" % n}} if n else {},
            {TABLE: {_key(c): b"%d" % c for c in range(1, n + 1)}} if n else {},
            [(_key(n), float(n), "processing")] if n else [],
            float(n) if n else None),
    }


async def observed(engine: Engine) -> dict[str, Any]:
    """What the engine holds of ``CONSUMER``'s commits, in :func:`expected_after`'s shape."""
    checkpoint = await engine.load_checkpoint(CONSUMER, 0, ["http"])
    position = checkpoint.input_positions.get(INPUT, 0)
    keyed = await engine.load_keyed_state(CONSUMER, 0, 1, [TABLE])
    external = {table: rows for table, rows in keyed.external.items() if rows}
    return {
        "position": position,
        "log": await engine.read("out", 0, 0, (position + 2) * MESSAGES),  # + 2: a partial later commit shows
        "outbox": checkpoint.outbox,
        "next_seq": checkpoint.next_seq,
        "progress": checkpoint.sink_progress["http"],
        "keyed": KeyedState(keyed.internal, external, sorted(keyed.timers), keyed.watermark),
    }


async def commit_forever(name: str, directory: Path) -> None:
    engine = await open_engine(name, directory)
    generation = await engine.acquire(CONSUMER, 0)
    n = (await engine.load_checkpoint(CONSUMER, 0, [])).input_positions.get(INPUT, 0)
    while True:
        n += 1
        await engine.commit(numbered_commit(generation, n))
        sys.stdout.write(f"{n}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(commit_forever(sys.argv[1], Path(sys.argv[2])))
