"""Standard Webhooks signatures (egress.webhook_signatures) against the reference implementation,
``standardwebhooks`` from PyPI: what we sign it verifies, what it signs we verify."""

from __future__ import annotations

import base64
import datetime
import os
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from egress.errors import SpecError
from egress.webhook_signatures import read_secrets, signature_header, signature_lines, verify

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
OTHER = "whsec_" + base64.b64encode(bytes(range(32))).decode()
BODY = b'{"type":"flight.landed","id":7}'


def headers_of(lines: tuple[str, ...]) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in lines)


def test_the_reference_library_verifies_what_we_sign_with_each_secret_of_a_rotation() -> None:
    keys = tuple(base64.b64decode(secret.removeprefix("whsec_")) for secret in (SECRET, OTHER))
    now = int(datetime.datetime.now(datetime.UTC).timestamp())
    headers = headers_of(signature_lines(keys, "0A1B2C", now, BODY))
    assert len(headers["webhook-signature"].split()) == 2
    for secret in (SECRET, OTHER):  # a receiver that knows only the old or only the new secret
        assert Webhook(secret).verify(BODY, headers) == {"type": "flight.landed", "id": 7}
    headers["webhook-signature"] = headers["webhook-signature"].replace("v1,", "v1,A", 1).split()[0]
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(BODY, headers)


def test_we_verify_what_the_reference_library_signs_and_refuse_changes() -> None:
    stamp = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    signature = Webhook(SECRET).sign("msg_1", stamp, BODY.decode())
    headers = {"Webhook-Id": "msg_1", "Webhook-Timestamp": str(int(stamp.timestamp())), "Webhook-Signature": signature}
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    assert signature == signature_header([key], "msg_1", int(stamp.timestamp()), BODY)
    assert verify([key], headers, BODY, stamp.timestamp()) is None
    assert verify([key], headers, BODY + b" ", stamp.timestamp()) == "no signature matches"
    assert verify([base64.b64decode(OTHER.removeprefix("whsec_"))], headers, BODY, stamp.timestamp()) is not None
    assert "more than 300 s" in str(verify([key], headers, BODY, stamp.timestamp() + 301))
    assert verify([key], headers, BODY, stamp.timestamp() - 299) is None
    assert verify([key], {"webhook-id": "x"}, BODY, stamp.timestamp()) is not None


def test_secrets_are_read_by_reference_with_errors_naming_the_reference_not_the_secret(tmp_path: Path,
                                                                                        monkeypatch: pytest.MonkeyPatch
                                                                                        ) -> None:
    file = tmp_path / "secret"
    file.write_text(f"# rotating: the new one first\n{SECRET}\n{OTHER}\n")
    assert len(read_secrets(file=str(file))) == 2
    monkeypatch.setenv("HOOK_SECRETS", f"{SECRET} {OTHER}")
    assert read_secrets(env="HOOK_SECRETS") == read_secrets(file=str(file))
    file.write_text("whsec_not*base64\n")
    with pytest.raises(SpecError, match=r"secret file .*secret, secret 1: a secret must be whsec_") as error:
        read_secrets(file=str(file))
    assert "not*base64" not in str(error.value)
    with pytest.raises(SpecError, match="cannot be read"):
        read_secrets(file=str(tmp_path / "missing"))
    monkeypatch.delenv("HOOK_SECRETS")
    with pytest.raises(SpecError, match="HOOK_SECRETS is not set"):
        read_secrets(env="HOOK_SECRETS")
    assert os.environ.get("HOOK_SECRETS") is None
