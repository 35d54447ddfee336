"""Per-unit locks of the NATS engine: a lease's renewals and its commits, a log partition's appends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable


@contextlib.asynccontextmanager
async def locked(locks: dict[tuple[str, int], asyncio.Lock], names: Iterable[tuple[str, int]]) -> AsyncIterator[None]:
    """Hold the locks of ``names`` (taken in sorted order, so two holders never wait on each other)."""
    async with contextlib.AsyncExitStack() as stack:
        for name in sorted(names):
            lock = locks.get(name)
            if lock is None:
                lock = locks[name] = asyncio.Lock()
            await stack.enter_async_context(lock)
        yield
