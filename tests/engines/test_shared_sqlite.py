"""SQLite shared by processes (``SqliteEngine(shared=True)``, what ``--processes N`` children
open): two worker processes (:mod:`tests.engines.lease_worker`) take leases and commit appends to
one log partition; stopping and killing them proves dense offsets, nothing lost, and the fence."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from egress.engines import SqliteEngine
from tests.conftest import REPO
from tests.engines.engines import PIPELINE
from tests.engines.lease_worker import APPENDS
from tests.sqlite_pause import pause_outside_write_transaction

pytestmark = pytest.mark.integration

WAIT = 60.0  # seconds for any one expected line, on a machine at load average 10


class Worker:
    """A running lease worker child and every line it printed."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name = name
        self.process = process
        self.lines: list[str] = []
        self.ended = False
        self._changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            async with self._changed:
                self.lines.append(raw.decode().strip())
                self._changed.notify_all()
        async with self._changed:
            self.ended = True
            self._changed.notify_all()

    async def saw(self, wanted: Callable[[str], bool], after: int = 0) -> int:
        """Wait until a line from index ``after`` on satisfies ``wanted``; its index."""
        async def found() -> int:
            async with self._changed:
                while True:
                    for index in range(after, len(self.lines)):
                        if wanted(self.lines[index]):
                            return index
                    if self.ended:
                        raise AssertionError(f"worker {self.name} ended: {self.lines[-5:]}")
                    await self._changed.wait()
        return await asyncio.wait_for(found(), WAIT)

    def committed(self) -> list[tuple[str, int]]:
        return [(parts[1], int(parts[2])) for parts in (line.split() for line in self.lines)
                if parts[0] == "committed"]

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        await self._reader


@contextlib.asynccontextmanager
async def started(directory: Path, *names: str) -> AsyncIterator[list[Worker]]:
    workers = []
    try:
        for name in names:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.engines.lease_worker", str(directory), name, cwd=REPO,
                stdout=asyncio.subprocess.PIPE)
            workers.append(Worker(name, process))
        yield workers
    finally:
        for worker in workers:
            if worker.process.returncode is None:
                os.kill(worker.process.pid, signal.SIGCONT)  # a stopped one too
            await worker.kill()


def holds_shared(line: str) -> bool:
    return line.startswith("committed shared")


def holding_shared(worker: Worker) -> bool:
    """Whether ``worker``'s last line about ``shared`` is a commit (under load a holder may have
    lost it to the other since, which then printed its own acquisition)."""
    about = [line for line in worker.lines if line.endswith(" shared") or "shared " in line]
    return bool(about) and holds_shared(about[-1])


async def test_processes_sharing_a_state_directory_commit_dense_offsets_and_a_stale_one_is_fenced(
        tmp_path: Path) -> None:
    directory = tmp_path / "state"
    async with started(directory, "a", "b") as (a, b):
        await a.saw(lambda line: line.startswith("committed own-a"))
        await b.saw(lambda line: line.startswith("committed own-b"))
        waits = [asyncio.create_task(worker.saw(holds_shared)) for worker in (a, b)]
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            task.result()
        holder, other = (a, b) if holding_shared(a) else (b, a)

        # Paused past its TTL, the holder's lease goes to the other worker; resumed, it is fenced.
        # Not inside its write transaction: that would block the shared database for everyone (one writer).
        await pause_outside_write_transaction(holder.process.pid, directory)
        await other.saw(lambda line: line.startswith("acquired shared"), after=len(other.lines))
        seen = len(holder.lines)
        holder.process.send_signal(signal.SIGCONT)
        await holder.saw(lambda line: line in ("fenced shared", "lost shared"), after=seen)
        await other.saw(holds_shared)

        # Killed, the new holder's lease lapses and the first takes it back.
        await other.kill()
        seen = len(holder.lines)
        await holder.saw(lambda line: line.startswith("acquired shared"), after=seen)
        await holder.saw(holds_shared, after=seen)
        await holder.kill()
        reported = [*a.committed(), *b.committed()]

    engine = SqliteEngine(directory, PIPELINE)
    await engine.open()
    try:
        log = await engine.read("out", 0, 0, 1_000_000)
        positions = {consumer: (await engine.load_checkpoint(consumer, 0, [])).input_positions[("in", 0)]
                     for consumer in ("own-a", "own-b", "shared")}
    finally:
        await engine.close()
    assert [m.offset for m in log] == list(range(len(log)))
    ids = Counter(m.message_id.decode() for m in log)
    assert [i for i, count in ids.items() if count > 1] == []
    # every commit reported is there whole, and every commit there is a consumer's next position
    commits = Counter(i.rsplit(":", 1)[0] for i in ids)
    assert set(commits.values()) == {APPENDS}
    assert {f"{consumer}:{n}" for consumer, n in reported} <= set(commits)
    assert set(commits) == {f"{consumer}:{n}" for consumer, last in positions.items() for n in range(1, last + 1)}
