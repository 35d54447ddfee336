"""The demo pipeline stopped part-way, then started with another ``partition_count``: refused with
one line and exit code 2, the state directory untouched; the original Spec then drains it all."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import state_contents
from tests.e2e.conftest import REPO, Receiver, hold_after, release, start_run, wait_until_held, write_spec
from tests.receiver_record import recorded

pytestmark = pytest.mark.e2e
NON_CANCELLED_FLIGHTS = 26_483



def egress(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "egress", *arguments], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.timeout(180)
def test_a_changed_partition_count_is_refused_and_the_original_spec_then_delivers_everything(
        tmp_path: Path, receiver: Receiver, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    state = tmp_path / "state"
    original = write_spec(tmp_path, receiver.port, 0)
    hold_after(receiver, 500)  # then the receiver holds the rest: the Ctrl-C lands before the run drains
    process, log = start_run(egress_processes, tmp_path, original, state, 0, until_drained=True)
    wait_until_held(receiver, process, log)
    process.send_signal(signal.SIGINT)
    release(receiver)
    assert process.wait(timeout=30) == 130, log.read_text()
    before = state_contents(state)

    changed = tmp_path / "spec-two-partitions.yaml"
    document = yaml.safe_load(original.read_text())
    document["partition_count"] = 2
    changed.write_text(yaml.safe_dump(document, sort_keys=False))
    expected = (f"{changed}: state directory {state} was written with partition_count 4; the Spec now says 2: run it "
                "with the Spec it was written with until drained, or give this Spec another --state-dir (egress does "
                "not move committed messages, state and timers to another layout)")
    refused = egress("run", str(changed), "--state-dir", str(state), "--until-drained")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [expected]
    checked = egress("validate", str(changed), "--state-dir", str(state))
    assert checked.returncode == 2, checked.stderr
    assert checked.stderr.splitlines() == [expected]
    assert state_contents(state) == before

    process, log = start_run(egress_processes, tmp_path, write_spec(tmp_path, receiver.port, 1), state, 1,
                             until_drained=True)
    assert process.wait(timeout=120) == 0, log.read_text()
    records = recorded(receiver.record)
    assert len({r["idempotency_key"] for r in records if r["status"] == 200}) == NON_CANCELLED_FLIGHTS
