"""Ctrl-C (SIGINT) stops ``egress run`` after the current epoch commits; the next run finishes the job."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.conftest import Receiver, hold_after, release, start_run, wait_until_held, write_spec
from tests.receiver_record import recorded

pytestmark = pytest.mark.e2e

ANSWERED = 2000  # requests answered before the receiver holds the rest: the interrupt lands mid-delivery


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
