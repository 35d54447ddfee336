"""What a sender needs of an HTTP client, and the offline transport that tests and tools use.

:class:`HttpTransport` is the shape of ``egress.httpclient.CurlClient`` that the HTTP sinks depend
on; :func:`submit_many` starts a batch of requests on any transport, with one callback per batch of
finished transfers when the transport supports it (``CurlClient.submit_many``), else one per request.
:class:`MockTransport` answers from a function, offline, batching as ``CurlClient`` does.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from egress.httpclient.curl import Completions, Request, Response, resolve_futures


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


class MockTransport:
    """An offline :class:`HttpTransport` for tests and tools: each request is answered with
    ``handler(request)`` on the next pass of the event loop, the requests of one ``submit_many``
    call as one batch (as ``CurlClient`` hands back what finished together). ``requests`` lists
    every request sent, in order; a request whose token is cancelled when submitted is not sent.
    ``submit`` and ``submit_many`` raise ``RuntimeError`` after ``close``."""

    def __init__(self, handler: Callable[[Request], Response]) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self.closed = False

    def submit(self, request: Request) -> asyncio.Future[Response]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Response] = loop.create_future()
        self.submit_many([(request, future)], Completions(loop, resolve_futures, asyncio.Future.cancelled))
        return future

    def submit_many(self, requests: Iterable[tuple[Request, Any]], completions: Completions) -> None:
        if self.closed:
            raise RuntimeError("MockTransport is closed")
        batch: list[tuple[Any, Response]] = []
        for request, token in requests:
            if completions.cancelled(token):
                continue
            self.requests.append(request)
            batch.append((token, self.handler(request)))
        if batch:
            completions.loop.call_soon(completions.callback, batch)

    def close(self) -> None:
        self.closed = True
