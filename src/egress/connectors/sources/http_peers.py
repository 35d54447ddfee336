"""Several http readers, one key window: a keyed request goes to the reader its key belongs to.

With ``readers: N`` every reader accepts, but an ``Idempotency-Key`` must be a duplicate on every
one. A key's **home** is one reader, :func:`key_home`; only the home accepts the key's events, so
its check and its commit (the key written with the events, under the home's lease) are one step,
as with one reader: a key seen by any worker is a duplicate on every worker, and a ``200`` still
follows the commit. A keyed request reaching another reader is sent on once, over loopback, to
the home (``port + home``, the header :data:`FORWARDED` naming the sender; its ``traceparent``
and ``tracestate`` with it), and its answer is
passed back (:class:`Peers`); a home that does not answer (its worker died, the reader not yet
taken over) makes it a ``503`` with ``Retry-After``, which a balancer's ``proxy_next_upstream
http_503`` or the client sends again. Requests without a key are accepted by whichever reader gets
them: no coordination at all.

The home is nginx's ``hash`` choice (``ngx_http_upstream_hash``, first try, equal weights):
``((crc32(key) >> 16) & 0x7fff) % N``. An nginx ``upstream`` listing the readers' ports in order
with ``hash $http_idempotency_key;`` sends each keyed request straight to its home (none is
forwarded) and requests without a key round robin.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from egress.lazy import lazy_module

if TYPE_CHECKING:
    import aiohttp
    from aiohttp import web
else:
    aiohttp = lazy_module("aiohttp")
    web = lazy_module("aiohttp.web")

FORWARDED = "Egress-Forwarded-By"
"""The header of a request one reader sends on to its key's home: the sender's reader number."""

# The W3C trace context too: the home continues the event's trace (egress.observe.tracing).
_PASSED_ON = ("Idempotency-Key", "Authorization", "Content-Type", "traceparent", "tracestate")
_ANSWER_HEADERS = ("Content-Type", "Retry-After", "WWW-Authenticate")


def key_home(key: str, readers: int) -> int:
    """The reader (``0 .. readers-1``) that accepts the events of ``Idempotency-Key`` ``key``."""
    if readers == 1:
        return 0
    hashed = (zlib.crc32(key.encode("utf-8", "surrogateescape")) >> 16) & 0x7FFF
    return hashed % readers


class Peers:
    """Sends keyed requests on to their home reader at ``http://host:base_port + home/path``;
    one connection pool, opened at the first forward and closed by :meth:`close`."""

    def __init__(self, host: str, base_port: int, path: str, partition: int, retry_after: int,
                 timeout: float) -> None:
        self._host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        self._base_port, self._path, self._partition = base_port, path, partition
        self._retry_after, self._timeout = retry_after, timeout
        self._session: aiohttp.ClientSession | None = None

    async def forward(self, request: web.Request, body: bytes, home: int) -> web.Response:
        """``request`` (its ``body`` read) answered by reader ``home``; ``503`` when it does not answer."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout),
                                                  connector=aiohttp.TCPConnector(limit=256))
        headers = {name: request.headers[name] for name in _PASSED_ON if name in request.headers}
        headers[FORWARDED] = str(self._partition)
        url = f"http://{self._host}:{self._base_port + home}{self._path}"
        try:
            async with self._session.post(url, data=body, headers=headers) as answer:
                content = await answer.read()
                passed = {name: answer.headers[name] for name in _ANSWER_HEADERS if name in answer.headers}
                return web.Response(status=answer.status, body=content, headers=passed)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            return web.json_response(
                {"error": f"the reader of this Idempotency-Key (reader {home}, port {self._base_port + home}) "
                          f"did not answer ({error.__class__.__name__}): send again"},
                status=503, headers={"Retry-After": str(self._retry_after)})

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
