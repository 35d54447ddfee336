"""Shared pieces of the live-input kill tests: a pass-through Spec over a given source, ``egress run``
processes, and the SIGKILL-and-restart loop ending in an ``--until-drained`` run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.conftest import pass_through_spec as source_pass_through_spec
from tests.e2e.conftest import REPO, RUN_HEADER, Receiver, wait_for_first_request

KILLS = 5
KILL_DELAY = (0.05, 0.8)  # seconds after the run's first request reached the receiver
SEED = int(os.environ.get("EGRESS_KILL_SEED", "20261201"))

Stopped = TypeVar("Stopped")


def pass_through_spec(directory: Path, pipeline: str, source: dict[str, Any], receiver_port: int, run: int) -> Path:
    """:func:`tests.conftest.pass_through_spec` to the receiver, with the run header, as ``spec-run<run>.yaml``."""
    return source_pass_through_spec(directory / f"spec-run{run}.yaml", pipeline, source,
                                    f"http://127.0.0.1:{receiver_port}/events", headers={RUN_HEADER: str(run)})


def start_egress(directory: Path, spec: Path, run: int, *options: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = directory / f"run{run}.log"
    with log.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "egress", "run", str(spec), "--state-dir",
                                    str(directory / "state"), "--quiet", *options],
                                   cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
    return process, log


def kill_restart_then_drain(directory: Path, receiver: Receiver, spec_of_run: Callable[[int], Path],
                            stop_input: Callable[[], Stopped],
                            before_kill: Callable[[int], None] = lambda run: None) -> Stopped:
    """Start ``KILLS`` runs, each SIGKILLed a seeded random moment after its first request reached
    the receiver and ``before_kill(run)`` returned (a test's own positive signal, e.g. how much the
    run took in); then ``stop_input()`` (the producer stops) and a final ``--until-drained`` run that
    must exit 0. Returns what ``stop_input`` returned."""
    rng = random.Random(SEED)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for run in range(KILLS):
            process, log = start_egress(directory, spec_of_run(run), run)
            processes.append(process)
            wait_for_first_request(receiver.record, run, process, log)
            before_kill(run)
            time.sleep(rng.uniform(*KILL_DELAY))
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            assert process.returncode == -signal.SIGKILL, log.read_text()
        stopped = stop_input()
        process, log = start_egress(directory, spec_of_run(KILLS), KILLS, "--until-drained")
        processes.append(process)
        assert process.wait(timeout=120) == 0, log.read_text()
        return stopped
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
