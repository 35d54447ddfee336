"""End to end: ``on_bad_record: fail`` stops the run at the bad record, after delivering every
record before it, those of the chunk the bad record is in included; a second run delivers nothing
more and stops at the same record.

Real processes and a real ``egress receiver --record``. 6,000 JSON lines, line 5,001 not JSON: the
source reads chunks of 4,096 records, so the bad record is in the second chunk, 904 records into it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope
from egress.runtime import RunOptions
from tests.conftest import pass_through_spec
from tests.e2e.conftest import REPO, Receiver
from tests.receiver_record import recorded

pytestmark = pytest.mark.e2e

ROWS, BAD_LINE = 6000, 5001
RUN_TIMEOUT = 120.0
PIPELINE = "bad_record"


def answered_keys(record: Path) -> list[str]:
    """The idempotency keys the receiver answered 2xx, once per answer."""
    requests = recorded(record)
    return [r["idempotency_key"] for r in requests if 200 <= r["status"] <= 299]


@pytest.mark.parametrize("until_drained", [True, False], ids=["until-drained", "until-stopped"])
def test_a_bad_record_under_fail_stops_the_run_after_every_record_before_it_is_delivered(
        tmp_path: Path, receiver: Receiver, until_drained: bool) -> None:
    assert RunOptions().source_chunk < BAD_LINE - 1 < 2 * RunOptions().source_chunk  # in the second chunk
    events = tmp_path / "ev.jsonl"
    lines = [json.dumps({"id": i, "payload": f"event {i}"}) for i in range(ROWS)]
    lines[BAD_LINE - 1] = "{not json"
    events.write_text("\n".join(lines) + "\n")
    spec = pass_through_spec(tmp_path / "spec.yaml", PIPELINE, {"source_class_name": "jsonl",
                                                                "parameters": {"path": str(events)}},
                             f"http://127.0.0.1:{receiver.port}/events")
    command = [sys.executable, "-m", "egress", "run", str(spec), "--state-dir", str(tmp_path / "state"), "--quiet",
               *(["--until-drained"] if until_drained else [])]
    scope = source_scope(PIPELINE, "input", str(events))
    before = {idempotency_key(derived_message_id(source_message_id(scope, 0, position), 0))
              for position in range(BAD_LINE - 1)}

    for run in (1, 2):  # the second run resumes at the bad record: nothing more to deliver, the same error
        finished = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        assert finished.returncode == 1, finished.stderr
        assert f"ev.jsonl:{BAD_LINE}: not valid JSON" in finished.stderr
        assert "on_bad_record" in finished.stderr  # the way on
        answered = answered_keys(receiver.record)
        assert set(answered) == before, f"run {run}: {len(set(answered))} keys answered of {len(before)}"
        assert len(answered) == len(before)  # each once: the second run sends nothing again
