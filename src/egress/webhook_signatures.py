"""Standard Webhooks signatures (https://www.standardwebhooks.com/, the specification's "Signature
scheme"): signing for the ``webhook_http`` sink, verifying for ``egress receiver --verify-secret``.

A request carries three headers: ``webhook-id`` (the message's idempotency key), ``webhook-timestamp``
(integer seconds since the Unix epoch, when the attempt was signed) and ``webhook-signature``: one
``v1,<base64 of HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`` per secret in force, separated by
spaces (several while a secret rotates). A secret is written ``whsec_<base64 of the key bytes>``.
Checked against the reference implementation (``standardwebhooks`` on PyPI) in
``tests/unit/test_webhook_signatures.py``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence

from egress.errors import SecretUnavailable, SpecError
from egress.secret_references import read_secret, variable

SECRET_PREFIX = "whsec_"
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
DEFAULT_TOLERANCE = 300.0
"""Seconds a ``webhook-timestamp`` may differ from the verifier's clock (the specification's 5 minutes)."""


def decode_secret(secret: str) -> bytes:
    """The key bytes of ``whsec_<base64>`` (the prefix may be left out, as the reference library
    allows). Raises ``ValueError`` naming what is wrong, never the secret itself."""
    text = secret.strip()
    if text.startswith(SECRET_PREFIX):
        text = text[len(SECRET_PREFIX):]
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a secret must be whsec_ followed by base64 (e.g. from `openssl rand -base64 32`)") from None
    if len(key) < 16:
        raise ValueError(f"a secret must hold at least 16 bytes of key (this one has {len(key)})")
    return key


def read_secrets(*, file: str | None = None, env: str | None = None) -> tuple[bytes, ...]:
    """The keys named by a reference: every non-empty line of ``file`` (lines starting ``#`` are
    comments), or every whitespace-separated word of the environment variable ``env``; the first is
    the newest by convention, all are used to sign. Raises :class:`SpecError` naming the file or the
    variable and the fix (never the secret)."""
    if file is None and env is None:
        return ()
    try:
        text = read_secret(file=file) if file is not None else read_secret(env=env)
    except SecretUnavailable as error:
        fix = ("write the whsec_ secret there (one per line) or name another file" if file is not None
               else "export it with the whsec_ secret (several separated by spaces)")
        raise SpecError(f"secret {error}; {fix}") from None
    assert text is not None
    if file is not None:
        where = f"secret file {file}"
        words = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    else:
        where = variable(env or "")
        words = text.split()
    if not words:
        raise SpecError(f"{where} holds no secret; write one whsec_... secret (one per line)")
    keys: list[bytes] = []
    for number, word in enumerate(words, 1):
        try:
            keys.append(decode_secret(word))
        except ValueError as error:
            raise SpecError(f"{where}, secret {number}: {error}") from None
    return tuple(keys)


def signed_content(message_id: str, timestamp: int, body: bytes) -> bytes:
    """What is signed: ``<id>.<timestamp>.<body>``."""
    return b"%s.%d.%s" % (message_id.encode(), timestamp, body)


def signature_header(keys: Sequence[bytes], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,<base64>`` per key, space separated."""
    content = signed_content(message_id, timestamp, body)
    # hmac.digest: the one-shot C path (no HMAC object per message and key)
    return " ".join("v1," + base64.b64encode(hmac.digest(key, content, "sha256")).decode() for key in keys)


def signature_lines(keys: Sequence[bytes], message_id: str, timestamp: int, body: bytes) -> tuple[str, str, str]:
    """The three header lines of a signed request (``name: value``)."""
    return (f"{ID_HEADER}: {message_id}", f"{TIMESTAMP_HEADER}: {timestamp}",
            f"{SIGNATURE_HEADER}: {signature_header(keys, message_id, timestamp, body)}")


def verify(keys: Iterable[bytes], headers: Mapping[str, str], body: bytes, now: float,
           tolerance: float = DEFAULT_TOLERANCE) -> str | None:
    """``None`` when one ``v1`` signature of ``headers`` (case-insensitive names) matches one of
    ``keys`` and the timestamp is within ``tolerance`` seconds of ``now``; else why not (each
    signature compared in constant time, ``hmac.compare_digest``)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    message_id, stamp, signatures = (lowered.get(ID_HEADER), lowered.get(TIMESTAMP_HEADER),
                                     lowered.get(SIGNATURE_HEADER))
    if message_id is None or stamp is None or signatures is None:
        return "missing webhook-id, webhook-timestamp or webhook-signature"
    if not (stamp.isascii() and stamp.isdecimal()):
        return "webhook-timestamp is not integer seconds"
    timestamp = int(stamp)
    if abs(now - timestamp) > tolerance:
        return f"webhook-timestamp {timestamp} is more than {tolerance:g} s from now"
    content = signed_content(message_id, timestamp, body)
    expected = [base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()) for key in keys]
    matched = False
    for signature in signatures.split():
        version, _, value = signature.partition(",")
        if version != "v1":
            continue
        for digest in expected:  # no early exit: the time does not tell which key matched
            matched |= hmac.compare_digest(digest, value.encode())
    return None if matched else "no signature matches"


__all__ = ["DEFAULT_TOLERANCE", "ID_HEADER", "SECRET_PREFIX", "SIGNATURE_HEADER", "TIMESTAMP_HEADER",
           "decode_secret", "read_secrets", "signature_header", "signature_lines", "signed_content", "verify"]
