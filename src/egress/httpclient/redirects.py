"""Redirect handling of the async HTTP sink as pure functions (no sockets).

Source: upstream ``TAsyncHttpSink`` redirect rules (``ResolvesRelativeRedirectLocations``,
``RejectsUnresolvableRedirectLocation``, ``RejectsHttpsToHttpRedirectWithoutSendingTheBody``), restated
in ``docs/http-sink.md``: an absolute ``Location`` is used as is; ``//host/x`` takes the current
scheme; ``?q`` keeps the current origin and path; ``/p`` is the origin plus the normalised path; a
relative path resolves against the current directory (``..`` pops, ``.`` is dropped, a trailing
``/`` is kept). The target must be http or https with a host.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from egress.errors import EgressError

REDIRECT_STATUSES = frozenset({301, 302, 303, 305, 307, 308})
HTTPS_TO_HTTP = "Async HTTP sink does not follow HTTPS to HTTP redirects"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


class RedirectError(EgressError, ValueError):
    """A ``Location`` that cannot be followed; the message says why."""


def is_http_url(url: str) -> bool:
    """True for an ``http`` or ``https`` URL with a host (what every egress sink may send to)."""
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        return False


def normalise_url(url: str) -> str:
    """``url`` without a fragment and without a ``?`` for an empty query (``POST /path``, not ``/path?``)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, ""))


def resolve_location(current: str, location: str) -> str:
    """The absolute URL a redirect from ``current`` to ``location`` leads to.

    Raises :class:`RedirectError` for an empty or unparseable ``Location``, or a target that is not
    http(s) with a host.
    """
    location = location.strip()
    if not location:
        raise RedirectError("Async HTTP sink redirect has an empty Location")
    try:
        base = urlsplit(current)
        origin = f"{base.scheme}://{base.netloc}"
        if _SCHEME.match(location):
            target = location
        elif location.startswith("//"):
            target = f"{base.scheme}:{location}"
        elif location.startswith("?"):
            target = origin + (base.path or "/") + location
        elif location.startswith("#"):
            target = origin + (base.path or "/") + (f"?{base.query}" if base.query else "")
        else:
            path, mark, query = location.partition("?")
            if not path.startswith("/"):
                directory = (base.path or "/")[: (base.path or "/").rfind("/") + 1]
                path = directory + path
            target = origin + _normalise_path(path) + (mark + query)
        parts = urlsplit(target)
        host = parts.hostname
    except ValueError as error:
        raise RedirectError(f"Async HTTP sink cannot resolve redirect Location {location!r}: {error}") from None
    if parts.scheme.lower() not in ("http", "https") or not host:
        raise RedirectError(f"Async HTTP sink redirect Location {location!r} is not an http or https URL with a host")
    return normalise_url(target)


def is_downgrade(current: str, target: str) -> bool:
    """True for an HTTPS → HTTP redirect, which is refused before the body is sent anywhere."""
    return urlsplit(current).scheme.lower() == "https" and urlsplit(target).scheme.lower() == "http"


def _normalise_path(path: str) -> str:
    segments = path.split("/")
    output: list[str] = []
    for segment in segments[1:]:
        if segment == "..":
            if output:
                output.pop()
        elif segment != ".":
            output.append(segment)
    if segments[-1] in (".", "..") and (not output or output[-1] != ""):
        output.append("")
    return "/" + "/".join(output)
