"""``egress run`` as an operator sees it: JSON logs a machine parses, line by line, without a secret
in any of them, and ``egress status`` against a running instance whose sink is blocked."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext
from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, Receiver, terminate
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

BEARER = "e2e-bearer-token-7f3a"
API_KEY = "e2e-api-key-91c2"
URL_PASSWORD = "e2e-url-password-55d1"
LEAK = "E2E_LEAKED_TOKEN"


class LogsASecretByMistake(ProcessFunction):
    """Passes each payload on, and logs the token in ``$E2E_LEAKED_TOKEN`` for message 0 (a process
    function that logs what it must not): the log line must carry ``***`` and the unit's context."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        if message.row["id"] == 0:
            logging.getLogger("tests.e2e").warning("calling with Authorization %s", os.environ[LEAK])
        output.add_message("requests", {"payload": message.row["payload"]})


def egress(*arguments: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "egress", *arguments], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})


def test_every_line_a_json_logs_run_writes_parses_and_none_carries_a_secret(
        tmp_path: Path, receiver: Receiver) -> None:
    url = f"http://egress:{URL_PASSWORD}@127.0.0.1:{receiver.port}/in"
    spec, dynamic = payload_spec(
        tmp_path, url, [f"p{i}" for i in range(20)], partition_count=2,
        sink_parameters={"headers": {"Authorization": f"Bearer {BEARER}", "X-Api-Key": API_KEY}},
        processing_function="tests.e2e.observe.test_observability:LogsASecretByMistake")
    run = egress("run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir", str(tmp_path / "state"),
                 "--until-drained", "--http-port", "0", "--log-format", "json", "--log-level", "debug",
                 env={LEAK: f"Bearer {BEARER}"})
    stdout, stderr = run.communicate(timeout=60)
    assert run.returncode == 0, stderr
    lines = (stdout + stderr).splitlines()
    records = [json.loads(line) for line in lines]  # every line, or this raises naming it
    assert records
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record)
    for secret in (BEARER, API_KEY, URL_PASSWORD):
        assert not [line for line in lines if secret in line]
    (leak,) = [r for r in records if r["logger"] == "tests.e2e"]
    assert leak["message"] == "calling with Authorization ***"  # the header value as the Spec has it
    assert (leak["pipeline"], leak["computation"]) == ("test_pipeline", "deliver")
    assert leak["partition"] in (0, 1)
    (finished,) = [r for r in records if r["message"] == "run finished"]
    assert finished["delivered"] == 20
    assert finished["drained"] is True


def test_egress_status_shows_the_partition_table_and_the_sinks_error(tmp_path: Path) -> None:
    from tests.e2e.conftest import launch_receiver, stop_receiver

    failing = launch_receiver(tmp_path / "received.jsonl", "--fail-rate", "1", "--fail-status", "500")
    run = None
    try:
        spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{failing.port}/in", [f"p{i}" for i in range(10)],
                                     dynamic_parameters={"max_attempt_count": 2})
        run = egress("run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir", str(tmp_path / "state"),
                     "--http-port", "0")
        base = _status_address(run)
        _wait_until_not_ready(base)
        shown = subprocess.run([sys.executable, "-m", "egress", "status", base], cwd=REPO, text=True,
                               capture_output=True, timeout=30, env={**os.environ, "COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        for text in ("partitions", "computation", "input lag", "unacknowledged", "deliver", "http: 10",
                     "unread records", "/sinks/http/async_http_sink",
                     "Async HTTP POST retry policy exhausted after 2 attempt(s)",
                     "NOT READY"):
            assert text in shown.stdout, text
    finally:
        if run is not None:
            terminate(run)  # type: ignore[arg-type]
        stop_receiver(failing)


def test_egress_status_exits_1_naming_the_url_when_nothing_answers() -> None:
    shown = subprocess.run([sys.executable, "-m", "egress", "status", "http://127.0.0.1:9/"], cwd=REPO, text=True,
                           capture_output=True, timeout=30)
    assert shown.returncode == 1
    assert "cannot read http://127.0.0.1:9/status" in shown.stderr


def _status_address(run: subprocess.Popen[str]) -> str:
    """The ``http://HOST:PORT/`` a text-mode run prints once its status endpoint listens."""
    assert run.stderr is not None
    for line in run.stderr:
        found = re.search(r"metrics and status at (http://127\.0\.0\.1:\d+/)", line)
        if found:
            assert "(/ the dashboard, /metrics, /status, /healthz, /readyz)" in line, line
            return found.group(1)
    pytest.fail(f"the run ended without serving its status (exit {run.wait()})")


def _wait_until_not_ready(base: str, limit: float = 30.0) -> None:
    """Until ``/readyz`` answers 503 (the sink is blocked)."""

    def not_ready() -> bool:
        try:
            urllib.request.urlopen(f"{base}readyz", timeout=5).close()
        except urllib.error.HTTPError as error:
            return error.code == 503
        return False

    eventually_sync(not_ready, what="the run becoming not-ready (/readyz 503)", timeout=limit, interval=0.1)
