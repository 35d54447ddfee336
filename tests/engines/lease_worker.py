"""The child of the multi-process SQLite test: a worker taking leases and committing log appends on
a state directory it shares with other processes, until it is killed.

``python -m tests.engines.lease_worker DIRECTORY WORKER`` opens ``SqliteEngine(DIRECTORY,
shared=True)`` and runs consumers ``own-<WORKER>`` (only this worker takes it) and ``shared`` (every
worker tries to), both partition 0, with leases of :data:`TTL` seconds. Each round it commits, for
every lease held, commit ``n`` (the next after the committed position): input position ``n`` and
:data:`APPENDS` log appends to ``("out", 0)`` with message ids ``<consumer>:<n>:<i>``; then renews
the lease. It prints, flushed, ``acquired <consumer> <generation> <position>``, ``committed <consumer>
<n>`` (after the commit returned), ``fenced <consumer>`` (a commit raised ``FencedError``) and
``lost <consumer>`` (a renewal returned False).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from egress.engines import EpochCommit, FencedError, SqliteEngine
from tests.engines.engines import PIPELINE

TTL = 2.0  # seconds: a renewal every round (20 ms) stays in time on a machine at load average 10
APPENDS = 5
ROUND = 0.02  # seconds between rounds


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def appends(consumer: str, n: int) -> EpochCommit:
    return EpochCommit(consumer, 0, 0, {("in", 0): n},
                       log_appends=[("out", 0, f"{consumer}:{n}:{i}".encode(), b"[]", None, {"n": n})
                                    for i in range(APPENDS)])


async def work(directory: Path, worker: str) -> None:
    engine = SqliteEngine(directory, PIPELINE, shared=True)
    await engine.open()
    held: dict[str, tuple[int, int]] = {}  # consumer -> (generation, committed position)
    while True:
        for consumer in (f"own-{worker}", "shared"):
            if consumer not in held:
                generation = await engine.try_acquire(consumer, 0, worker, TTL)
                if generation is None:
                    continue
                position = (await engine.load_checkpoint(consumer, 0, [])).input_positions.get(("in", 0), 0)
                held[consumer] = (generation, position)
                say(f"acquired {consumer} {generation} {position}")
            generation, position = held[consumer]
            commit = appends(consumer, position + 1)
            commit.generation = generation
            try:
                await engine.commit(commit)
            except FencedError:
                say(f"fenced {consumer}")
                del held[consumer]
                continue
            held[consumer] = (generation, position + 1)
            say(f"committed {consumer} {position + 1}")
            if not await engine.renew(consumer, 0, generation, TTL):
                say(f"lost {consumer}")
                del held[consumer]
        await asyncio.sleep(ROUND)


if __name__ == "__main__":
    asyncio.run(work(Path(sys.argv[1]), sys.argv[2]))
