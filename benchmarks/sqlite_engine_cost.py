"""CPU per message of the SQLite engine, driven as ``egress run`` drives it in the delivery benchmark.

What is measured, in one process (every thread: ``resource.getrusage(RUSAGE_SELF)``, user + system),
on a fresh state directory with the engine's defaults (WAL, ``synchronous=FULL``):

1. a source reader commits ``--messages`` (100,000) messages of ~330-byte rows (an ``id`` and a
   ~300-character ``payload``, as ``benchmarks/delivery.py``'s) in chunks of ``--chunk`` (4,096,
   the runtime's ``source_chunk``), spread over ``--partitions`` (4) log partitions, each chunk one
   commit with its position;
2. after each chunk, each partition job reads its partition ``--epoch`` (230: 100,000 messages in
   ~435 epochs, as in the delivery benchmark) messages at a time and commits each epoch: its
   input position, one outbox message per message read (``{"payload": ...}``), its sink's progress
   and the outbox acknowledged up to the previous epoch (the sink acknowledges one epoch later);
3. the engine is closed and opened again, and each partition job loads its checkpoint (the
   outbox of its last epoch, not yet acknowledged, is read back).

The figure is the CPU of all of that (open and close included) ÷ messages, best of ``--repeat``
(3). Compare two checkouts by alternating ``PYTHONPATH``::

    PYTHONPATH=/work/main/src python benchmarks/sqlite_engine_cost.py
    PYTHONPATH=src python benchmarks/sqlite_engine_cost.py
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

from egress.engines import EpochCommit, LogAppend, OutboxMessage, SinkProgress, SqliteEngine
from egress.keys import derived_message_id, encode_key, partition_of, source_message_id

CONSUMER = "to_requests"
SOURCE = "source:payloads"


def payload(index: int) -> str:
    """A ~300-character JSON body, different per message (as the flight rows are)."""
    return (f'{{"year":2013,"month":1,"day":{index % 31},"dep_time":{index % 2400},"sched_dep_time":515,'
            f'"dep_delay":2.0,"arr_time":830,"sched_arr_time":819,"arr_delay":11.0,"carrier":"UA",'
            f'"flight":{index % 9999},"tailnum":"N14228","origin":"EWR","dest":"IAH","air_time":227.0,'
            f'"distance":1400,"hour":5,"minute":15,"time_hour":"2013-01-01T10:00:00Z","index":{index}}}')


def source_chunks(count: int, chunk: int, partitions: int) -> list[list[LogAppend]]:
    """The source reader's log appends, chunk by chunk (built before the clock starts)."""
    chunks: list[list[LogAppend]] = []
    for start in range(0, count, chunk):
        appends: list[LogAppend] = []
        for index in range(start, min(count, start + chunk)):
            key = encode_key([index])
            appends.append(("rows", partition_of(key, partitions), source_message_id("scope", 0, index), key, None,
                            {"id": index, "payload": payload(index)}))
        chunks.append(appends)
    return chunks


async def one_run(state_dir: Path, chunks: list[list[LogAppend]], partitions: int, epoch_size: int) -> int:
    """Drive the engine through the run; the messages delivered."""
    engine = SqliteEngine(state_dir, "bench")
    await engine.open()
    source_generation = await engine.acquire(SOURCE, 0)
    job_generations = [await engine.acquire(CONSUMER, p) for p in range(partitions)]
    for partition in range(partitions):
        await engine.load_checkpoint(CONSUMER, partition, ["http"])
    positions = [0] * partitions
    next_seq = [1] * partitions
    acknowledged = [0] * partitions
    read = 0
    position = 0
    for appends in chunks:
        position += len(appends)
        await engine.commit(EpochCommit(SOURCE, 0, source_generation, {("", 0): position}, log_appends=appends))
        for partition in range(partitions):
            while batch := await engine.read("rows", partition, positions[partition], epoch_size):
                read += len(batch)
                seq = next_seq[partition]
                outbox = [OutboxMessage(seq + i, "requests", derived_message_id(m.message_id, 0), m.key,
                                        m.event_timestamp, {"payload": m.row["payload"]})
                          for i, m in enumerate(batch)]
                next_seq[partition] = seq + len(batch)
                positions[partition] = batch[-1].offset + 1
                low = acknowledged[partition]
                await engine.commit(EpochCommit(
                    CONSUMER, partition, job_generations[partition], {("rows", partition): positions[partition]},
                    outbox=outbox, sink_progress={"http": SinkProgress("", None, low)},
                    outbox_acknowledged_seq=low))
                acknowledged[partition] = seq - 1  # the sink persists an epoch's messages during the next
    await engine.close()
    engine = SqliteEngine(state_dir, "bench")
    await engine.open()
    waiting = 0
    for partition in range(partitions):
        waiting += len((await engine.load_checkpoint(CONSUMER, partition, ["http"])).outbox)
    await engine.close()
    assert waiting > 0
    return read


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--epoch", type=int, default=230)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    chunks = source_chunks(options.messages, options.chunk, options.partitions)
    results: list[tuple[float, float, float, float]] = []
    for _ in range(options.repeat):
        with tempfile.TemporaryDirectory(prefix="egress-sqlite-cost-") as work:
            before = resource.getrusage(resource.RUSAGE_SELF)
            started = time.perf_counter()
            read = asyncio.run(one_run(Path(work), chunks, options.partitions, options.epoch))
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_SELF)
            assert read == options.messages, read
            user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
            results.append(((user + system) / read * 1e6, user / read * 1e6, system / read * 1e6, wall))
    for total, user, system, wall in results:
        print(f"cpu {total:6.2f} µs/msg (user {user:5.2f}, system {system:5.2f}), wall {wall:5.2f} s")
    best = min(results)
    print(f"best: {best[0]:.2f} µs/msg (user {best[1]:.2f}, system {best[2]:.2f})")


if __name__ == "__main__":
    main()
