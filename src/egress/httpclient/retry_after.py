"""The ``Retry-After`` response header as a pure function of its value and the wall time.

Source: RFC 9110 §10.2.3: ``Retry-After = HTTP-date / delay-seconds``, where ``delay-seconds`` is
``1*DIGIT`` (a non-negative decimal integer of seconds) and an ``HTTP-date`` is one of the three
formats of §5.6.7 (IMF-fixdate ``Sun, 06 Nov 1994 08:49:37 GMT``, the obsolete RFC 850 form
``Sunday, 06-Nov-94 08:49:37 GMT`` and asctime's ``Sun Nov  6 08:49:37 1994``), always UTC. The dates
are parsed by the standard library (``email.utils.parsedate_to_datetime``). The header means "wait
this long" with a 503 (RFC 9110 §15.6.4) and a 429 (RFC 6585 §4); the HTTP client keeps it only for
those statuses (:data:`RETRY_AFTER_STATUSES`).
"""

from __future__ import annotations

import datetime
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

RETRY_AFTER_STATUSES = frozenset({429, 503})
# Larger delay-seconds are cut here before becoming a float (a value of 400 digits would overflow);
# every caller caps the wait far below it anyway.
MAX_DELAY_SECONDS = 2**31
DEFAULT_PORTS = {"http": 80, "https": 443}


def retry_after_seconds(value: str, now: float) -> float | None:
    """The wait ``value`` asks for, in seconds from ``now``, or ``None`` when it is neither form.

    ``value`` is the raw header value (surrounding whitespace is allowed); ``now`` is the wall time in
    seconds since the Unix epoch (``Clock.now()``), against which an HTTP-date is measured. A date in
    the past means 0. A date without a zone (asctime's form) is UTC, as every HTTP-date is.
    """
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(min(int(text), MAX_DELAY_SECONDS))
    try:
        date = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if date.tzinfo is None:
        date = date.replace(tzinfo=datetime.UTC)
    return max(0.0, date.timestamp() - now)


def endpoint_of(url: str) -> tuple[str, str, int]:
    """What a ``Retry-After`` pauses: the (scheme, host, port) of ``url``, lower-case, with the
    scheme's default port when none is given (``http://h/x`` and ``http://H:80/y`` are one endpoint).
    A port that does not parse is kept as -1: such a URL is an endpoint of its own."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1
    return scheme, (parts.hostname or "").lower(), port if port is not None else DEFAULT_PORTS.get(scheme, -1)
