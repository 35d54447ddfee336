"""Fixtures of the engine conformance suite: each test runs once per engine in ``ENGINES``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from egress.engines import Engine
from tests.engines.engines import CLUSTERS, ENGINES, PIPELINE, Cluster, open_engine

OpenEngine = Callable[[], Awaitable[Engine]]


@pytest.fixture(params=sorted(ENGINES))
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def reopen(engine_name: str, tmp_path: Path) -> AsyncIterator[OpenEngine]:
    """Opens the engine under test on this test's directory: the first call makes it, each later
    call (after ``close()``) opens what the earlier ones committed. Every engine opened is
    closed at the end (``close()`` is safe twice)."""
    opened: list[Engine] = []

    async def open_again() -> Engine:
        engine = await open_engine(engine_name, tmp_path / "engine")
        opened.append(engine)
        return engine

    yield open_again
    for engine in opened:
        await engine.close()


@pytest.fixture
async def engine(reopen: OpenEngine) -> Engine:
    """An opened engine of the kind under test, on an empty directory."""
    return await reopen()


class Workers:
    """Engines of several workers on this test's storage (:class:`Cluster`), opened by :meth:`open`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.ttl = cluster.ttl
        self.opened: list[Engine] = []

    async def open(self) -> Engine:
        engine = self.cluster.make()
        self.opened.append(engine)
        await engine.open()
        return engine

    async def tick(self) -> None:
        """Let a quarter of :attr:`ttl` pass, as the engines measure lease time."""
        await self.cluster.tick()

    async def until(self, condition: Callable[[], Awaitable[bool]],
                    meanwhile: Callable[[], Awaitable[object]] | None = None, ticks: int = 40) -> None:
        """Tick until ``condition()`` holds (running ``meanwhile()`` after each tick); fails after
        ``ticks`` ticks (ten TTLs)."""
        for _ in range(ticks):
            if await condition():
                return
            await self.tick()
            if meanwhile is not None:
                await meanwhile()
        raise AssertionError(f"not within {ticks} ticks of {self.ttl / 4:g} s: {condition}")


@pytest.fixture
async def workers(engine_name: str, tmp_path: Path) -> AsyncIterator[Workers]:
    """Workers' engines of the kind under test on one empty storage; all closed at the end."""
    opened = Workers(CLUSTERS[engine_name](tmp_path / "engine", PIPELINE))
    yield opened
    for engine in opened.opened:
        await engine.close()
