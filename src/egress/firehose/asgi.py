"""The Firehose receiver as an ASGI application, for ASGI servers (uvicorn, hypercorn) and frameworks
that mount ASGI apps (Starlette, FastAPI, Django).

``FirehoseASGI(receiver)`` runs the same decision table as the aiohttp application through
:meth:`FirehoseReceiver.answer`. ASGI servers do not decompress request bodies, so both size caps
are exact; a body not whole within ``body_timeout`` is answered 408 (the server decides about the
connection). Lifespan events are acknowledged; WebSocket connections are closed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from multidict import CIMultiDict

from egress.firehose.receiver import FirehoseReceiver, Incoming
from egress.http_body import UnreadableBodyError, within_deadline

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class FirehoseASGI:
    """An ASGI 3 application serving ``receiver``; the path is taken relative to ``root_path``."""

    def __init__(self, receiver: FirehoseReceiver) -> None:
        self.receiver = receiver

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        else:
            await send({"type": "websocket.close", "code": 1000})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one HTTP request through the receiver's decision table."""
        headers: CIMultiDict[str] = CIMultiDict(
            (name.decode("latin-1"), value.decode("utf-8", "surrogateescape").strip(" \t"))
            for name, value in scope.get("headers", ()))
        path = scope.get("path", "/")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"

        def chunks() -> AsyncIterator[bytes]:
            return within_deadline(_received(receive), self.receiver.options.body_timeout)

        incoming = Incoming(scope["method"], path, _content_length(headers), headers, chunks, lambda: None)
        status, body = await self.receiver.answer(incoming)
        response_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 405:
            response_headers.append((b"allow", b"POST"))
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


async def _lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge the lifespan events until the shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _received(receive: Receive) -> AsyncIterator[bytes]:
    """The request body's chunks as the server hands them; raises :class:`UnreadableBodyError` when
    the client disconnects before the body ended."""
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise UnreadableBodyError("the client disconnected before the body ended")
        more = bool(message.get("more_body", False))
        body = message.get("body", b"")
        if body:
            yield body


def _content_length(headers: CIMultiDict[str]) -> int | None:
    value = headers.get("Content-Length")
    return int(value) if value is not None and value.isdigit() else None
