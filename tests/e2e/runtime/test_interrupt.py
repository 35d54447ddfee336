"""Ctrl-C (SIGINT) stops ``egress run`` once the process function's call in hand returns, committing
what each epoch processed; the next run finishes the job."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import yaml

from tests.conftest import REPO, payload_spec
from tests.e2e.conftest import Receiver, hold_after, release, start_run, wait_until_held, write_spec
from tests.interrupted_exit import write_spec as write_sinkless_spec
from tests.receiver_record import recorded
from tests.waiting import eventually_sync, exited

pytestmark = pytest.mark.e2e

ANSWERED = 2000  # requests answered before the receiver holds the rest: the interrupt lands mid-delivery
STOPPING_AS = "stopping after the message in hand; what was processed is committed ({} to exit at once)"
STOPPING = STOPPING_AS.format("Ctrl-C again")
SLOW_ROWS = 600  # read in epochs of hundreds (the source's commits; measured: the first one has 256 rows)
SECONDS_PER_ROW = 0.2
STOP_BOUND = 15.0  # seconds from the Ctrl-C to the exit: one row, the commit and the exit; an epoch is ~50 s


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
    release(receiver)  # the endpoint answers again: the run stops after the message in hand, not at a stall
    assert process.wait(timeout=30) == 130, log.read_text()  # stopped cleanly, but not drained
    assert time.monotonic() - interrupted < 10, "a graceful stop must not wait for the whole backlog"
    assert STOPPING in log.read_text()
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
    assert rest.strip().splitlines() == [STOPPING, "second interrupt: exiting at once; the final commit is made"]


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
        assert next(lines) == STOPPING_AS.format(again) + "\n"
        process.send_signal(signum)
        rest = stderr.read()
        assert process.wait(timeout=60) == 130, rest
    assert rest == "second interrupt: exiting at once without the final commit\n"


def slow_run(tmp_path: Path, spec: Path, dynamic: Path, engine: list[str], run: int, seconds_per_row: float,
             started: Path | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    """``egress run --until-drained`` of ``spec`` (with the ``engine`` options) whose ``SlowCountingRows``
    takes ``seconds_per_row`` per row (blocking the loop) and creates ``started`` after its third row;
    stderr to the log returned."""
    environment = {**os.environ, "EGRESS_TEST_SECONDS_PER_ROW": str(seconds_per_row)}
    if started is not None:
        environment["EGRESS_TEST_STARTED_FILE"] = str(started)
    log = tmp_path / f"run{run}.stderr"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir",
             str(tmp_path / "state"), "--quiet", "--until-drained", *engine], cwd=REPO, env=environment, stdout=stderr,
            stderr=subprocess.STDOUT)
    return process, log


@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine", ["sqlite", "nats"])
def test_a_ctrl_c_mid_epoch_of_a_slow_function_stops_after_the_row_in_hand_and_the_rerun_processes_each_row_once(
        tmp_path: Path, receiver: Receiver, engine: str, request: pytest.FixtureRequest) -> None:
    """A function that blocks the loop for SECONDS_PER_ROW per row, in epochs of hundreds of rows:
    the first Ctrl-C ends the epoch after the row in hand and commits the rows processed (their
    positions, state and outputs), so the run exits within STOP_BOUND, not after the whole epoch;
    the rerun goes on from there: every row is delivered, each processed into state once. The same
    on the embedded SQLite engine and as a cluster worker on NATS (one epoch code for both)."""
    spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events",
                                 [f"p{i}" for i in range(SLOW_ROWS)],
                                 processing_function="tests.pipelines:SlowCountingRows")
    options: list[str] = []
    if engine == "nats":  # a bucket of this test's own on the session's server
        document = yaml.safe_load(spec.read_text())
        document["pipeline"] = f"slow_stop_{uuid.uuid4().hex[:8]}"
        spec.write_text(yaml.safe_dump(document))
        options = ["--engine", request.getfixturevalue("nats_server")]
    started = tmp_path / "started"
    process, log = slow_run(tmp_path, spec, dynamic, options, 0, SECONDS_PER_ROW, started)
    try:
        eventually_sync(started.exists, what="the third row processed", timeout=60,
                        unless=exited(process, log), details=log.read_text)
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        code = process.wait(timeout=120)
        took = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 130, log.read_text()  # stopped cleanly, not drained: as for any first Ctrl-C
    assert took < STOP_BOUND, f"the stop took {took:.1f} s: it waited for the epoch, not the row in hand"
    assert STOPPING in log.read_text()
    assert "interrupted before every message was delivered" in log.read_text()

    process, log = slow_run(tmp_path, spec, dynamic, options, 1, 0.0)
    assert process.wait(timeout=120) == 0, log.read_text()
    delivered = {r["idempotency_key"]: r["body_sha256"] for r in recorded(receiver.record) if r["status"] == 200}
    expected = {hashlib.sha256(f"p{i}:1".encode()).hexdigest() for i in range(SLOW_ROWS)}
    assert len(delivered) == SLOW_ROWS  # none lost
    assert set(delivered.values()) == expected  # each processed into state once (a second time shows as ":2")
