"""End to end: a run that stops because its process function raised commits, on the way out, the
acknowledgements it had received, so the next run re-sends only what was in flight.

Real processes and a real ``egress receiver --record``. The first run's function raises on
message ``FAIL_AT`` only after the receiver has answered 2xx every message of the epochs committed
before it (``FAIL_AT - epoch_max_messages`` of them at least): those acknowledgements reached the
sink before the failure. The second run (the function no longer raises) must deliver the rest and
POST again at most the sink's ``max_in_flight`` keys that already had their 2xx.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from egress.runtime import RunOptions
from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, Receiver
from tests.e2e.failing_functions import ANSWERED, FAIL_AT, STATS_URL
from tests.receiver_record import recorded

pytestmark = pytest.mark.e2e

MESSAGES = 2600
FAILS_AT = 2500
MAX_IN_FLIGHT = 8
RUN_TIMEOUT = 60.0


def egress_run(spec: Path, dynamic: Path, state: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir", str(state),
         "--until-drained", "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT, env={**os.environ, **env})


def answered_keys(record: Path) -> list[str]:
    """The idempotency keys the receiver answered 2xx, in record order (a key once per answer)."""
    requests = recorded(record)
    return [r["idempotency_key"] for r in requests if 200 <= r["status"] <= 299]


def test_a_rerun_after_a_process_function_error_resends_only_what_was_in_flight(
        tmp_path: Path, receiver: Receiver) -> None:
    url = f"http://127.0.0.1:{receiver.port}"
    spec, dynamic = payload_spec(tmp_path, f"{url}/events", [f"p{i}" for i in range(MESSAGES)],
                                 processing_function="tests.e2e.failing_functions:RaisesOnceAnswered",
                                 sink_parameters={"max_in_flight": MAX_IN_FLIGHT})
    state = tmp_path / "state"
    committed_before = FAILS_AT - RunOptions().epoch_max_messages
    failed = egress_run(spec, dynamic, state, {FAIL_AT: str(FAILS_AT), STATS_URL: f"{url}/stats",
                                               ANSWERED: str(committed_before)})
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"planted failure on id {FAILS_AT}" in failed.stdout + failed.stderr
    first = set(answered_keys(receiver.record))
    assert len(first) >= committed_before

    rerun = egress_run(spec, dynamic, state, {})
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    answered = Counter(answered_keys(receiver.record))
    assert len(answered) == MESSAGES  # everything arrived
    resent = sum(1 for key in first if answered[key] > 1)
    told = f"{resent} of {len(first)} keys answered 2xx before the failure were POSTed again"
    print(told)  # pytest -s: the figure (before the fix: every one of them)
    assert resent <= MAX_IN_FLIGHT, told
