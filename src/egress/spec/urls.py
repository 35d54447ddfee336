"""What makes an ``http``/``https`` endpoint URL unusable, found when the Spec is checked.

``urllib.parse.urlsplit`` accepts a URL whose port is not a number or out of range, or whose host
holds a space; a run would only fail on its first request (libcurl: "URL rejected" or "could not
resolve host"), after the pipeline started. :func:`endpoint_url_problem` says what is wrong and how
to fix it, for the sinks' URL validators.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

_HOST_NAME = re.compile(r"\w(?:[\w-]*\w)?(?:\.\w(?:[\w-]*\w)?)*\.?")
"""A DNS name (internationalised letters too) or an IPv4 address: dot-separated labels of letters,
digits, ``_`` and inner ``-``, as resolvers take them."""


def endpoint_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be sent to, as the rest of a sentence after "URL ": not ``http``/``https``
    with a host (upstream's message), a space or control character, a port that is not a number in
    1..65535, a host with characters no host name has; ``None`` when none of these."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return "must use http or https and contain a host"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must use http or https and contain a host"
    for index, character in enumerate(url):
        if character.isspace() or ord(character) < 0x20 or ord(character) == 0x7F:
            where = "a space" if character == " " else f"the control character {character!r}"
            return (f"contains {where} at position {index + 1}: remove it (in a path or query, "
                    "percent-encode it, e.g. %20)")
    try:
        port = parts.port
    except ValueError:
        written = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        return f"has port {written!r}, not a number from 1 to 65535: fix the port after the host's ':'"
    if port == 0:
        return "has port 0: use a port from 1 to 65535"
    host = parts.hostname or ""
    if host.startswith("[") or ":" in host:  # an IPv6 literal: urlsplit has checked its brackets
        return None
    if not _HOST_NAME.fullmatch(host):
        return (f"has host {host!r}, which is not a host name or an IP address: use labels of letters, "
                "digits and '-' separated by single dots")
    return None
