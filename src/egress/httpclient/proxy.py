"""The proxy environment variables, read once, with libcurl's own rules.

libcurl reads ``no_proxy``, ``http_proxy``, ``all_proxy`` and their kin with ``getenv`` at every
transfer (five lookups for an ``http://`` URL with none set); egress's client reads them once, when it
is built, and sets ``CURLOPT_PROXY`` and ``CURLOPT_NOPROXY`` on each handle from them, which stops
libcurl's own lookups and keeps what they would have chosen:

* ``http://``: ``http_proxy`` (lower case only: ``HTTP_PROXY`` can be set by a CGI request's
  ``Proxy:`` header, so libcurl ignores it), else ``all_proxy``, else ``ALL_PROXY``;
* ``https://``: ``https_proxy``, else ``HTTPS_PROXY``, else ``all_proxy``, else ``ALL_PROXY``;
* hosts that bypass it: ``no_proxy``, else ``NO_PROXY`` (libcurl's syntax: comma-separated names,
  domain suffixes, IP addresses or CIDR ranges, ``*`` for every host).

An empty variable counts as unset, as in libcurl. A variable changed after the client was built is not
seen by that client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

# Per URL scheme, the variables libcurl consults in order (curl's lib/proxy.c).
_PROXY_VARIABLES: dict[str, tuple[str, ...]] = {
    "http": ("http_proxy", "all_proxy", "ALL_PROXY"),
    "https": ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"),
}
_NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY")


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str:
    return next((environ[name] for name in names if environ.get(name)), "")


class ProxyOptions(NamedTuple):
    """What libcurl gets in place of its reading of the environment: ``no_proxy`` for
    ``CURLOPT_NOPROXY`` on every handle (``""``: no host exempted), and ``proxies`` the
    ``CURLOPT_PROXY`` of a URL of scheme ``http`` or ``https`` (``""``: none). A URL of another
    scheme gets no ``CURLOPT_PROXY``, so libcurl still reads its ``<scheme>_proxy`` variables."""

    no_proxy: str
    proxies: dict[str, str]


def proxy_options(environ: Mapping[str, str]) -> ProxyOptions:
    """The :class:`ProxyOptions` that ``environ`` (such as ``os.environ``) sets by libcurl's rules
    (module docstring)."""
    return ProxyOptions(_first(environ, _NO_PROXY_VARIABLES),
                        {scheme: _first(environ, names) for scheme, names in _PROXY_VARIABLES.items()})
