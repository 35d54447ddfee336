"""The Firehose receiver as the CLI serves it: a real process, keys from the environment, SIGTERM to stop."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from egress.cli.firehose import access_keys_from_environment
from egress.firehose import protocol as p
from tests.receiver_record import recorded

pytestmark = pytest.mark.integration

SECRET = "rotation-key-A-8f3b"
SECOND = "rotation-key-B-11c2"


def start(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    args = ", ".join(["host='127.0.0.1'", "port=0", *extra])
    code = ("import sys, typer; from pathlib import Path; from egress.cli.firehose import run_firehose_receiver as r\n"
            f"try:\n    r({args})\nexcept typer.Exit as e:\n    sys.exit(e.exit_code)")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})}, cwd=tmp_path)


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str], Path]]:
    record = tmp_path / "received.jsonl"
    process = start(tmp_path, "access_key_env=['FH_KEY_A', 'FH_KEY_B']", f"record=Path({str(record)!r})",
                    env={"FH_KEY_A": SECRET, "FH_KEY_B": SECOND})
    assert process.stdout is not None
    line = process.stdout.readline()  # blocks until the server listens (or the process dies)
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    assert match, (line, process.stderr.read() if process.stderr else "")
    yield f"http://127.0.0.1:{match.group(1)}", process, record
    if process.poll() is None:
        process.kill()
        process.wait(30)


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_serves_the_protocol_and_stops_on_sigterm(receiver: tuple[str, subprocess.Popen[str], Path]) -> None:
    url, process, record = receiver
    body = p.encode_request_body("req-1", 1578090901599, [b"hello", b"hello world"])
    headers = p.request_headers("req-1", source_arn="arn:aws:firehose:us-east-1:1:deliverystream/s",
                                access_key=SECOND, gzip_body=True)
    assert post(url + "/", gzip.compress(body), headers)[0] == 200
    assert post(url + "/", gzip.compress(body), headers)[0] == 200  # a retry: same request id
    status, answer = post(url + "/", body, {**headers, "X-Amz-Firehose-Access-Key": "wrong", "Content-Encoding": ""})
    assert (status, answer["errorMessage"]) == (401, "invalid firehose access key")
    with urllib.request.urlopen(url + "/stats", timeout=30) as response:
        stats = json.loads(response.read())
    assert stats["records_accepted"] == 4
    assert stats["distinct_request_ids"] == 1
    assert stats["repeated_request_ids"] == 1
    assert stats["by_status"] == {"200": 2, "401": 1}
    with urllib.request.urlopen(url + "/health", timeout=30) as response:
        assert response.status == 200

    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    lines = recorded(record)
    assert [(line["requestId"], line["records"], line["bytes"]) for line in lines] == [("req-1", 2, 16)] * 2
    for text in (stderr, record.read_text()):
        assert SECRET not in text
        assert SECOND not in text


def test_missing_key_variable_exits_2_without_showing_values(tmp_path: Path) -> None:
    process = start(tmp_path, "access_key_env=['FH_KEY_UNSET_FOR_TEST']")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "egress: environment variable FH_KEY_UNSET_FOR_TEST (an access key) is not set or empty: export it" in stderr


def test_access_keys_without_the_firehose_protocol_are_refused() -> None:
    from typer.testing import CliRunner

    from egress.cli.main import app

    result = CliRunner().invoke(app, ["receiver", "--port", "0", "--access-key-env", "SOME_KEY"],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "only with --protocol firehose" in result.output


def test_access_keys_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FH_A", "a")
    monkeypatch.setenv("FH_EMPTY", "")
    monkeypatch.setenv("FH_HUGE", "k" * 4097)
    assert access_keys_from_environment(["FH_A"]) == ("a",)
    for name in ("FH_EMPTY", "FH_HUGE", "FH_NOT_SET_AT_ALL"):
        with pytest.raises(ValueError, match=name) as raised:
            access_keys_from_environment([name])
        assert "kkkk" not in str(raised.value)
