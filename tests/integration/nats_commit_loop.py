"""The child of the NATS outage tests: the conformance suite's commit loop on servers the test owns.

``python -m tests.integration.nats_commit_loop URLS BUCKET REPLICAS`` opens a ``NatsEngine`` on
``URLS`` (comma-separated) with bucket ``BUCKET`` and ``REPLICAS`` stream replicas, takes
``commit_loop.CONSUMER`` partition 0 and commits ``commit_loop.numbered_commit`` n = position + 1,
+ 2, … printing each n once its commit returned (see ``tests/engines/commit_loop.py``). Requests
time out after :data:`REQUEST_TIMEOUT` seconds, so a commit in flight when a server dies is tried
again soon; an outage longer than :data:`OUTAGE_TIMEOUT` seconds ends the loop (exit code 3).
"""

from __future__ import annotations

import asyncio
import sys

from egress.engines.nats import NatsEngine, NatsUnavailableError
from tests.engines.commit_loop import CONSUMER, INPUT, numbered_commit
from tests.engines.engines import PIPELINE

REQUEST_TIMEOUT = 2.0
OUTAGE_TIMEOUT = 30.0


def engine_on(urls: list[str], bucket: str, replicas: int) -> NatsEngine:
    return NatsEngine(urls, PIPELINE, bucket=bucket, replicas=replicas, request_timeout=REQUEST_TIMEOUT,
                      outage_timeout=OUTAGE_TIMEOUT)


async def commit_forever(urls: list[str], bucket: str, replicas: int) -> None:
    engine = engine_on(urls, bucket, replicas)
    await engine.open()
    generation = await engine.acquire(CONSUMER, 0)
    n = (await engine.load_checkpoint(CONSUMER, 0, [])).input_positions.get(INPUT, 0)
    try:
        while True:
            n += 1
            await engine.commit(numbered_commit(generation, n))
            sys.stdout.write(f"{n}\n")
            sys.stdout.flush()
    except NatsUnavailableError as error:
        sys.stderr.write(f"{error}\n")
        raise SystemExit(3) from None


if __name__ == "__main__":
    asyncio.run(commit_forever(sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])))
