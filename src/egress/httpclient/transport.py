"""What a sender needs of an HTTP client, and the offline transport that tests and tools use.

:class:`HttpTransport` is the shape of ``egress.httpclient.CurlClient`` that the HTTP sinks depend
on; :func:`submit_many` starts a batch of requests on any transport, with one callback per batch of
finished transfers when the transport supports it (``CurlClient.submit_many``), else one per request.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable
from typing import Any, Protocol

from egress.httpclient.curl import Completions, Request, Response


class HttpTransport(Protocol):
    """What a sink needs of an HTTP client (``egress.httpclient.CurlClient`` in production):
    ``submit`` starts a request and returns the future of its response (never an exception)."""

    def submit(self, request: Request) -> asyncio.Future[Response]: ...

    def close(self) -> None: ...


def submit_many(transport: HttpTransport, requests: Iterable[tuple[Request, Any]],
                completions: Completions) -> list[asyncio.Future[Response]]:
    """Start each ``(request, token)`` on ``transport``; responses reach ``completions.callback`` as
    ``[(token, response), ...]``. A transport with ``submit_many`` (``CurlClient``) batches them and
    this returns ``[]``; any other gets one ``submit`` per request, and this returns their futures,
    so that the caller may cancel one (a cancelled future delivers nothing)."""
    many = getattr(transport, "submit_many", None)
    if many is not None:
        many(requests, completions)
        return []
    futures: list[asyncio.Future[Response]] = []
    for request, token in requests:
        future = transport.submit(request)
        future.add_done_callback(functools.partial(_one_done, completions, token))
        futures.append(future)
    return futures


def _one_done(completions: Completions, token: Any, future: asyncio.Future[Response]) -> None:
    if not future.cancelled():
        completions.callback([(token, future.result())])
