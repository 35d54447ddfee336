"""Ctrl-C (SIGINT) stops ``egress run`` after the current epoch commits; the next run finishes the job."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.conftest import REPO
from tests.e2e.conftest import Receiver, hold_after, release, start_run, wait_until_held, write_spec
from tests.interrupted_exit import write_spec as write_sinkless_spec
from tests.receiver_record import recorded

pytestmark = pytest.mark.e2e

ANSWERED = 2000  # requests answered before the receiver holds the rest: the interrupt lands mid-delivery


@contextlib.contextmanager
def sinkless_run(tmp_path: Path, module: str, processing_function: str | None = None) -> \
        Iterator[tuple[subprocess.Popen[str], IO[str]]]:
    """``python -m MODULE run`` of the sinkless one-event Spec (its ``processing_function`` when
    given), with its stderr to read; killed if still running when the block ends."""
    spec = write_sinkless_spec(tmp_path, processing_function=processing_function)
    process = subprocess.Popen(
        [sys.executable, "-m", module, "run", str(spec), "--quiet", "--http-port", "0",
         "--state-dir", str(tmp_path / "state")], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        yield process, process.stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.timeout(180)
def test_interrupt_commits_then_a_second_run_completes_without_loss(
        tmp_path: Path, receiver: Receiver, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    state = tmp_path / "state"
    spec = write_spec(tmp_path, receiver.port, 0)
    hold_after(receiver, ANSWERED)
    process, log = start_run(egress_processes, tmp_path, spec, state, 0, until_drained=True)
    wait_until_held(receiver, process, log)
    process.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    release(receiver)  # the endpoint answers again: the run stops after its current epoch, not at a stall
    assert process.wait(timeout=30) == 130, log.read_text()  # stopped cleanly, but not drained
    assert time.monotonic() - interrupted < 10, "a graceful stop must not wait for the whole backlog"
    assert "stopping after the current epoch commits" in log.read_text()
    assert "interrupted before every message was delivered" in log.read_text()
    first_run = recorded(receiver.record)
    assert 0 < len(first_run) < 26_483, "the interrupt must land mid-delivery"

    spec = write_spec(tmp_path, receiver.port, 1)
    process, log = start_run(egress_processes, tmp_path, spec, state, 1, until_drained=True)
    assert process.wait(timeout=120) == 0, log.read_text()
    records = recorded(receiver.record)
    delivered = Counter(r["idempotency_key"] for r in records if r["status"] == 200)
    assert len(delivered) == 26_483
    # Messages acknowledged before the interrupt were committed with the final epoch: the second run
    # resends only what was still in flight then, never the whole first run.
    resent = sum(count - 1 for count in delivered.values())
    assert resent < len(first_run)


@pytest.mark.timeout(120)
def test_a_second_interrupt_in_the_exit_after_the_final_commit_exits_130_without_a_traceback(
        tmp_path: Path) -> None:
    """The first Ctrl-C stops the run; the second lands in ``settle_for_exit``'s collection, after
    the loop and its signal handlers are gone (``tests.interrupted_exit`` sends it there)."""
    with sinkless_run(tmp_path, "tests.interrupted_exit") as (process, stderr):
        first = stderr.readline()  # said at once: the run has started and handles Ctrl-C
        assert first.startswith("dashboard, metrics and status at "), first
        process.send_signal(signal.SIGINT)
        rest = stderr.read()
        assert process.wait(timeout=60) == 130, rest
    assert "Traceback" not in rest, rest
    assert rest.strip().splitlines() == ["stopping after the current epoch commits (Ctrl-C again to exit at once)",
                                         "second interrupt: exiting at once; the final commit is made"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("signum", "again"), [(signal.SIGINT, "Ctrl-C again"),
                                               (signal.SIGTERM, "SIGTERM again, or Ctrl-C,")])
def test_ctrl_c_is_answered_while_a_process_function_blocks_the_loop_and_the_second_exits_130(
        tmp_path: Path, signum: signal.Signals, again: str) -> None:
    """The signal handlers are the process's, not the loop's: a map blocking the loop's thread
    does not keep the first Ctrl-C (or SIGTERM, which says so) unanswered nor the second from
    exiting at once."""
    with sinkless_run(tmp_path, "egress", processing_function="tests.pipelines:BlocksTheLoop") as (process, stderr):
        lines = iter(stderr.readline, "")
        assert next(line for line in lines if line == "blocking the loop\n")
        process.send_signal(signum)
        assert next(lines) == f"stopping after the current epoch commits ({again} to exit at once)\n"
        process.send_signal(signum)
        rest = stderr.read()
        assert process.wait(timeout=60) == 130, rest
    assert rest == "second interrupt: exiting at once without the final commit\n"
