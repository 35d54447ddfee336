"""Fixtures of the engine conformance suite: each test runs once per engine in ``ENGINES``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from egress.engines import Engine
from tests.engines.engines import ENGINES, open_engine

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
