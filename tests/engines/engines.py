"""The engines the conformance suite runs against, and the records its tests commit.

``ENGINES`` maps an engine's name to how to make one, not yet opened, for a directory and a
pipeline name (the same shape as ``egress.runtime.EngineFactory`` without the run options). Every
test in ``tests/engines/`` runs once per entry, the SIGKILL child included (it is given the name),
so adding an engine is one line here, and one in ``CLUSTERS``: several workers' engines on one
directory and how their lease time passes.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from egress.clock import VirtualClock
from egress.engines import Engine, OutboxMessage, SqliteEngine
from tests.nats_server import nats_url

PIPELINE = "conformance"


def nats_engine(directory: Path, pipeline: str) -> Engine:
    """A ``NatsEngine`` on the tests' nats-server whose bucket is named after ``directory``: each
    test has its own, and reopening (or a child process) on the same directory finds it again."""
    from egress.engines.nats import NatsEngine

    digest = hashlib.blake2b(str(directory.resolve()).encode(), digest_size=8).hexdigest()
    return NatsEngine(nats_url(), pipeline, bucket=f"egress_test_{digest}")


ENGINES: dict[str, Callable[[Path, str], Engine]] = {
    "sqlite": SqliteEngine,
    "nats": nats_engine,
}


@dataclass(frozen=True)
class Cluster:
    """Workers sharing one pipeline's storage: ``make()`` gives another worker's engine (not yet
    opened) on it; ``ttl`` is the lease TTL the tests use and ``tick()`` lets a quarter of it pass
    as the engine measures TTLs (virtual time for SQLite; real time for NATS, whose server expires
    leases: ticks are short, tests wait for a positive signal)."""

    make: Callable[[], Engine]
    ttl: float
    tick: Callable[[], Awaitable[None]]


def sqlite_cluster(directory: Path, pipeline: str) -> Cluster:
    """Shared ``SqliteEngine`` s on ``directory`` (as ``--processes`` children open them), their
    TTLs on one virtual clock."""
    clock = VirtualClock(1_000_000.0)
    ttl = 10.0
    return Cluster(lambda: SqliteEngine(directory, pipeline, clock=clock, shared=True), ttl,
                   lambda: clock.advance(ttl / 4))


def nats_cluster(directory: Path, pipeline: str) -> Cluster:
    """``NatsEngine`` s on the bucket of ``directory``; TTL 1 s, the server's granularity."""
    return Cluster(lambda: nats_engine(directory, pipeline), 1.0, lambda: asyncio.sleep(0.25))


CLUSTERS: dict[str, Callable[[Path, str], Cluster]] = {
    "sqlite": sqlite_cluster,
    "nats": nats_cluster,
}


async def open_engine(name: str, directory: Path) -> Engine:
    """An opened engine ``name`` on ``directory`` for :data:`PIPELINE` (closed again if opening fails)."""
    engine = ENGINES[name](directory, PIPELINE)
    try:
        await engine.open()
    except BaseException:
        await engine.close()
        raise
    return engine


def outbox_message(seq: int, stream: str = "requests") -> OutboxMessage:
    """Outbox message ``seq`` with an id, key, timestamp and row derived from it."""
    return OutboxMessage(seq, stream, f"id{seq}".encode(), f'["k{seq}"]'.encode(), 1.5 + seq, {"payload": f"p{seq}"})
