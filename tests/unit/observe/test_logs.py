"""Log lines: JSON with the context fields, text for people, and no secret in either."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from egress.observe.logs import add_secret, configure_logging, log_context, redact, secrets_of_spec, unit_context


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """JSON logging at debug level into a buffer; the root logger's handlers are restored afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    configure_logging("json", "debug", stream=stream)
    yield stream
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)


def records(stream: io.StringIO) -> list[dict[str, object]]:
    """The records of the test's logger (asyncio logs too at debug level)."""
    parsed = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [record for record in parsed if record["logger"] == "egress.test"]


def test_a_json_line_carries_time_level_logger_message_and_the_log_context(lines: io.StringIO) -> None:
    with log_context(pipeline="flights"):
        logging.getLogger("egress.test").warning("sent %d", 3, extra={"fields": {"sink": "http",
                                                                                 "message_id": b"\x01\xff"}})
    (record,) = records(lines)
    assert record["level"] == "warning"
    assert record["logger"] == "egress.test"
    assert record["message"] == "sent 3"
    assert record["pipeline"] == "flights"
    assert record["sink"] == "http"
    assert record["message_id"] == "01ff"
    assert str(record["time"]).endswith("Z")


async def test_a_units_task_logs_with_its_computation_and_partition(lines: io.StringIO) -> None:
    async def job() -> None:
        logging.getLogger("egress.test").info("inside")

    with log_context(pipeline="flights"):
        await asyncio.create_task(job(), context=unit_context("to_json", 2))
    (record,) = records(lines)
    assert (record["pipeline"], record["computation"], record["partition"]) == ("flights", "to_json", 2)


def test_registered_secrets_url_passwords_and_authorization_values_never_reach_a_line(lines: io.StringIO) -> None:
    add_secret("k3y-registered-value")
    log = logging.getLogger("egress.test")
    log.error("key k3y-registered-value at nats://egress:pa55word@127.0.0.1:4222",
              extra={"fields": {"header": "Authorization: Bearer tok3n-in-a-field",
                                "nested": {"k": "k3y-registered-value"}}})
    try:
        raise ValueError("failed with k3y-registered-value")
    except ValueError:
        log.exception("authorization=Basic c2VjcmV0Cg==")
    text = lines.getvalue()
    for secret in ("k3y-registered-value", "pa55word", "tok3n-in-a-field", "c2VjcmV0Cg=="):
        assert secret not in text
    first, second = records(lines)
    assert first["message"] == "key *** at nats://egress:***@127.0.0.1:4222"
    assert first["nested"] == {"k": "***"}
    assert "ValueError: failed with ***" in str(second["exception"])


def test_the_secrets_of_a_spec_are_its_referenced_variables_files_and_credential_headers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIREHOSE_KEY", "firehose-key-value")
    monkeypatch.setenv("NATS_PASSWORD", "nats-password-value")
    (tmp_path / "token.txt").write_text("bearer-token-value\n")
    spec = {"sources": {"in": {"parameters": {"password_env": "NATS_PASSWORD", "bearer_token_file": "token.txt",
                                              "path": "data.csv"}}},
            "computations": {"c": {"sinks": {
                "fh": {"parameters": {"access_key": {"env": "FIREHOSE_KEY"}, "url": "https://example.com"}},
                "http": {"parameters": {"headers": {"Authorization": "Bearer header-token", "X-Api-Key": "api-key-1",
                                                    "Content-Type": "application/json"}}}}}}}
    found = set(secrets_of_spec(spec, tmp_path))
    assert {"firehose-key-value", "nats-password-value", "bearer-token-value", "Bearer header-token",
            "api-key-1"} <= found
    assert "application/json" not in found
    assert "https://example.com" not in found


def test_a_short_value_is_not_taken_for_a_secret() -> None:
    add_secret("abc")
    assert redact("abc def") == "abc def"


def test_text_lines_put_the_context_after_the_message() -> None:
    root = logging.getLogger()
    handlers = list(root.handlers)
    stream = io.StringIO()
    try:
        configure_logging("text", "info", stream=stream)
        with log_context(pipeline="flights"):
            logging.getLogger("egress.test").info("hello")
            logging.getLogger("egress.test").debug("not shown")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        logging.captureWarnings(False)
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(" INFO egress.test: hello [pipeline=flights]")
