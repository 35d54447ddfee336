"""egress.secret_references.read_secret: what a secret's reference reads, and how it fails without the secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from egress.errors import EgressError, SecretUnavailable
from egress.secret_references import read_secret

SECRET = "s3cr3t-value"


def test_an_environment_variable_is_read_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGRESS_TEST_SECRET", f" {SECRET}\n")
    assert read_secret(env="EGRESS_TEST_SECRET") == f" {SECRET}\n"


def test_a_file_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(f"{SECRET}\nsecond\n")
    assert read_secret(file=tmp_path / "key") == f"{SECRET}\nsecond\n"


def test_no_reference_reads_nothing() -> None:
    assert read_secret() is None


def test_an_unset_variable_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EGRESS_TEST_SECRET", raising=False)
    with pytest.raises(SecretUnavailable) as raised:
        read_secret(env="EGRESS_TEST_SECRET")
    assert (raised.value.where, raised.value.problem) == ("environment variable EGRESS_TEST_SECRET", "is not set")
    assert isinstance(raised.value, EgressError)


def test_a_missing_file_is_named_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(SecretUnavailable, match=r"file .*absent cannot be read \(No such file or directory\)"):
        read_secret(file=tmp_path / "absent")


def test_a_file_that_is_not_utf8_is_refused_without_showing_it(tmp_path: Path) -> None:
    (tmp_path / "key").write_bytes(b"\xff\xfe" + SECRET.encode())
    with pytest.raises(SecretUnavailable, match="is not UTF-8 text") as raised:
        read_secret(file=tmp_path / "key")
    assert SECRET not in str(raised.value)
