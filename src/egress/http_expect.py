"""The ``Expect`` handling of egress's aiohttp servers (the receivers, the throttler service).

aiohttp's default handler answers ``100 Continue`` to ``Expect: 100-continue`` and otherwise builds
a 417 whose text quotes the header as it came; a value that is not UTF-8 (``Expect: \\x80``) makes
building that answer raise, and the client gets a 500. :func:`expect_handler` is the same handling
with the value quoted by ``repr``: a 417 whatever the bytes. Give it to every route
(``add_route(..., expect_handler=expect_handler)``); the aiohttp default still runs for a request
no route matches, so a server that must never answer 500 ends with a catch-all route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.http import HttpVersion11


async def expect_handler(request: web.Request) -> None:
    """Answer ``100 Continue`` to an HTTP/1.1 ``Expect: 100-continue``; raise ``417 Expectation
    Failed`` for any other ``Expect`` value (aiohttp's rules, the value shown escaped)."""
    expect = request.headers.get("Expect", "")
    if request.version != HttpVersion11:
        return
    if expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the 100 is not part of the answer's size
        return
    raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect!r}")


def unrouted_handler(allowed: Mapping[str, str]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The catch-all route's handler (``add_route("*", "/{tail:.*}", ...)``, added last): ``405``
    with ``Allow: allowed[path]`` for a path served with other methods, else ``404``; as aiohttp
    answers without a catch-all, but on a route, so that :func:`expect_handler` answers its ``Expect``."""

    async def handler(request: web.Request) -> web.Response:
        methods = allowed.get(request.path)
        if methods is not None:
            return web.Response(status=405, text=f"{request.method} is not allowed: {methods}\n",
                                headers={"Allow": methods})
        return web.Response(status=404, text=f"not found: {request.path!r}\n")

    return handler
