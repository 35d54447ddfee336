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


@pytest.mark.parametrize("written", ["whsec_i6qwCYUqNBvTSml0+2uLHB5sIqAWsV3gLWZ4tzmQmfQ=", "change-me-secret-value",
                                     "my key"])
def test_a_reference_that_is_no_variable_name_is_not_repeated_in_the_error(written: str) -> None:
    """A value where a variable's name belongs is most likely the secret itself: the error says so
    and never shows it."""
    with pytest.raises(SecretUnavailable) as caught:
        read_secret(env=written)
    assert written not in str(caught.value)
    assert "not a variable's name" in str(caught.value)


def test_a_spec_whose_webhook_secret_env_holds_the_secret_is_refused_without_showing_it(tmp_path: Path) -> None:
    from egress.connectors.sinks.webhook_parameters import WebhookSinkDynamicParameters

    secret = "whsec_i6qwCYUqNBvTSml0+2uLHB5sIqAWsV3gLWZ4tzmQmfQ="
    with pytest.raises(ValueError, match="not a variable's name") as caught:
        WebhookSinkDynamicParameters.model_validate(
            {"endpoints": {"a": {"url": "http://127.0.0.1:9/h", "secret_env": secret}}})
    assert secret not in str(caught.value)


def test_the_unset_variables_of_a_spec_never_repeat_a_value_written_in_place_of_a_name() -> None:
    from egress.runtime.plan import unset_environment

    secret = "whsec_i6qwCYUqNBvTSml0+2uLHB5sIqAWsV3gLWZ4tzmQmfQ="
    [problem] = unset_environment({"bearer_token_env": secret}, "sources/in/parameters", "spec.yaml")
    assert secret not in str(problem)
    assert str(problem).startswith("spec.yaml: sources/in/parameters/bearer_token_env: the environment variable "
                                   "named here (not a variable's name")
