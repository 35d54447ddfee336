"""A credential file a live source names (``bearer_token_file``, ``credentials_file``) is checked by
``egress validate`` as the source's start reads it: missing, unreadable or empty is one error naming
the parameter and the file, never its content."""

from __future__ import annotations

from pathlib import Path

import pytest

from egress.connectors.sources.http import HttpSource, HttpSourceParameters
from egress.connectors.sources.nats import NatsSource, NatsSourceParameters
from egress.spec import StreamSpec

STREAM = StreamSpec.model_validate({"schema": [{"name": "payload", "type": "string"}]})


def http_errors(base: Path, file: str) -> list[str]:
    parameters = HttpSourceParameters(port=0, bearer_token_file=file)
    return [f"{e.path}: {e.message}" for e in HttpSource.check(parameters, STREAM, base)]


def test_an_empty_token_file_is_a_spec_error_not_a_failure_at_the_start(tmp_path: Path) -> None:
    """validate said the Spec was valid; run then failed at the source's start (exit 1, no Spec file named)."""
    (tmp_path / "token").write_text(" \n")
    assert http_errors(tmp_path, "token") == [
        f"parameters/bearer_token_file: file {tmp_path / 'token'} is empty: write the secret there or name another "
        "file"]


def test_a_directory_is_not_reported_as_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "token").mkdir()
    assert http_errors(tmp_path, "token") == [
        f"parameters/bearer_token_file: file {tmp_path / 'token'} cannot be read (Is a directory): write the secret "
        "there or name another file"]


def test_a_missing_file_says_where_a_relative_path_starts(tmp_path: Path) -> None:
    assert http_errors(tmp_path, "token") == [
        f"parameters/bearer_token_file: file not found: {tmp_path / 'token'} (a relative path starts at the Spec's "
        "folder)"]


@pytest.mark.parametrize("content", [b"", b"\xff\xfe"], ids=["empty", "not-utf8"])
def test_a_nats_credentials_file_is_checked_alike_without_showing_it(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "orders.creds").write_bytes(content)
    parameters = NatsSourceParameters(url="nats://127.0.0.1:4222", stream="ORDERS", credentials_file="orders.creds")
    [error] = [e for e in NatsSource.check(parameters, STREAM, tmp_path) if e.path == "parameters/credentials_file"]
    assert error.message.startswith(f"file {tmp_path / 'orders.creds'} ")
    assert error.message.endswith(": write the secret there or name another file")


def test_a_token_file_with_a_token_passes(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("hook-token-1234\n")
    assert http_errors(tmp_path, "token") == []
