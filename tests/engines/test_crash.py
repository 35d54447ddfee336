"""Conformance, atomicity under SIGKILL: a commit interrupted by a kill is absent, never partial."""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.engines.commit_loop import expected_after, observed
from tests.engines.engines import open_engine

pytestmark = pytest.mark.integration

ROUNDS = 3


async def commit_until_killed(engine_name: str, directory: Path, reports: int, rng: random.Random) -> int:
    """Run the commit loop child until it has reported ``reports`` commits, SIGKILL it then (or a
    random fraction of a millisecond later) and return the last commit it reported before dying:
    it may have reported more than ``reports`` by the time the signal lands."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.engines.commit_loop", engine_name, str(directory), cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    assert child.stderr is not None
    last = 0
    try:
        for _ in range(reports):
            line = await asyncio.wait_for(child.stdout.readline(), timeout=60)
            if not line.endswith(b"\n"):
                raise AssertionError(f"the commit loop ended: {(await child.stderr.read()).decode()}")
            last = int(line)
        await asyncio.sleep(rng.uniform(0, 0.001))
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL
    for line in (await child.stdout.read()).splitlines(keepends=True):
        if line.endswith(b"\n"):
            last = int(line)
    return last


async def test_a_commit_interrupted_by_sigkill_is_all_or_nothing(engine_name: str, tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    directory = tmp_path / "engine"
    # Opened here first, so that an engine's server (the tests' nats-server) is this process's and
    # the child uses it: one the child started would die unstopped with it, and its commits with it.
    await (await open_engine(engine_name, directory)).close()
    for round_ in range(ROUNDS):
        reported = await commit_until_killed(engine_name, directory, rng.randint(3, 30), rng)
        engine = await open_engine(engine_name, directory)
        try:
            found = await observed(engine)
        finally:
            await engine.close()
        position = found["position"]
        context = f"seed {seed}, round {round_}: reported {reported}, committed position {position}"
        assert position in (reported, reported + 1), context  # the one in flight may have committed
        assert found == expected_after(position), context
