"""Commit and read throughput of the NATS engine, beside the SQLite engine, on the same epochs.

What is measured, in one process, against a nats-server (JetStream, file storage, default
``sync_interval``) started on 127.0.0.1 with a temporary store and stopped at the end, or against
``--url``: epochs of ``--messages`` (default 1,000) messages of ~200-byte rows, ``--epochs``
(default 100) of each shape, committed one after the other by one consumer partition:

1. ``source``: a source reader's commit: its position and 1,000 log appends spread over 4 log
   partitions (one log chunk message per partition).
2. ``delivery``: a partition job of the HTTP delivery example: input positions, 1,000 outbox
   messages, the sink's progress and the outbox trimmed up to the previous epoch.
3. ``keyed``: the same plus 1,000 state writes to distinct keys: over one atomic batch's 1,000
   messages, so the keyed writes go as redo chunks in the batch and are applied after it.
4. ``read``: a fresh engine reads back the 100,000 log messages of ``source`` from one partition
   after another, ``--read-limit`` (2,048, the runtime's ``epoch_max_messages``) at a time.

Figures are messages / wall time (client and server share the machine). The last line is one
comparable summary. Run it from the repository root (figures: ``docs/cluster.md``)::

    python benchmarks/nats_engine.py
    python benchmarks/nats_engine.py --epochs 30 --url nats://127.0.0.1:4222
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.nats_server import nats_url, stop_nats_server  # noqa: E402

from egress.engines import Engine, EpochCommit, LogAppend, OutboxMessage, SinkProgress, SqliteEngine  # noqa: E402
from egress.engines.nats import NatsEngine  # noqa: E402
from egress.keys import encode_key  # noqa: E402

PARTITIONS = 4
ROW = {"payload": "x" * 180, "carrier": "UA", "flight": 1545}


def source_epoch(generation: int, n: int, size: int) -> EpochCommit:
    appends: list[LogAppend] = [("events", i % PARTITIONS, b"%d:%d" % (n, i), encode_key([i]), float(n), ROW)
                                for i in range(size)]
    return EpochCommit("source:bench", 0, generation, {("", 0): (n + 1) * size}, log_appends=appends)


def delivery_epoch(consumer: str, generation: int, n: int, size: int, keyed: bool = False) -> EpochCommit:
    outbox = [OutboxMessage(n * size + i + 1, "requests", b"%d:%d" % (n, i), encode_key([i]), float(n), ROW)
              for i in range(size)]
    return EpochCommit(
        consumer, 0, generation, {("events", 0): (n + 1) * size}, outbox=outbox,
        sink_progress={"http": SinkProgress("", b"%d" % n, n * size)}, outbox_acknowledged_seq=n * size,
        state_writes={("counts", encode_key([n * size + i])): b"%d" % n for i in range(size)} if keyed else {})


async def commits_per_second(engine: Engine, consumer: str, make: Callable[[int, int], EpochCommit],
                             epochs: int, size: int) -> float:
    generation = await engine.acquire(consumer, 0)
    await engine.commit(make(generation, 0))  # warm: the first commit loads the checkpoint
    started = time.perf_counter()
    for n in range(1, epochs + 1):
        await engine.commit(make(generation, n))
    return epochs * size / (time.perf_counter() - started)


async def reads_per_second(engine: Engine, limit: int) -> tuple[float, int]:
    started = time.perf_counter()
    total = 0
    for partition in range(PARTITIONS):
        offset = 0
        while batch := await engine.read("events", partition, offset, limit):
            offset = batch[-1].offset + 1
            total += len(batch)
    return total / (time.perf_counter() - started), total


async def measure(name: str, make_engine: Callable[[], Engine], epochs: int, size: int,
                  read_limit: int) -> dict[str, float]:
    shapes: dict[str, tuple[str, Callable[[int, int], EpochCommit]]] = {
        "source": ("source:bench", lambda e, n: source_epoch(e, n, size)),
        "delivery": ("deliver", lambda e, n: delivery_epoch("deliver", e, n, size)),
        "keyed": ("keyed", lambda e, n: delivery_epoch("keyed", e, n, size, keyed=True)),
    }
    figures: dict[str, float] = {}
    for shape, (consumer, make) in shapes.items():
        engine = make_engine()
        await engine.open()
        try:
            figures[shape] = await commits_per_second(engine, consumer, make, epochs, size)
        finally:
            await engine.close()
    reader = make_engine()
    await reader.open()
    try:
        figures["read"], total = await reads_per_second(reader, read_limit)
    finally:
        await reader.close()
    assert total == (epochs + 1) * size, f"{name}: read {total} messages"
    print(f"{name}: " + ", ".join(f"{shape} {value:,.0f} msg/s" for shape, value in figures.items()), flush=True)
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--messages", type=int, default=1000, help="messages per epoch")
    parser.add_argument("--read-limit", type=int, default=2048)
    parser.add_argument("--url", help="a running nats-server with JetStream (default: start one)")
    args = parser.parse_args()
    url = args.url or nats_url()
    stamp = str(time.time_ns())
    try:
        with tempfile.TemporaryDirectory() as directory:
            sqlite = await measure("sqlite", lambda: SqliteEngine(Path(directory), "bench"),
                                   args.epochs, args.messages, args.read_limit)
            nats = await measure("nats", lambda: NatsEngine(url, "bench", bucket=f"egress_bench_{stamp}"),
                                 args.epochs, args.messages, args.read_limit)
    finally:
        stop_nats_server()
    print("nats engine: " + " | ".join(f"{shape} {nats[shape]:,.0f} msg/s (sqlite {sqlite[shape]:,.0f})"
                                        for shape in nats))


if __name__ == "__main__":
    asyncio.run(main())
