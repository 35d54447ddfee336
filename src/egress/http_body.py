"""Reading a request body in egress's aiohttp servers: all of it, up to a size, by a deadline.

aiohttp's ``request.content.read(n)`` returns what has arrived so far, not the body: a body that
comes in pieces (written in several sends, chunked, or larger than one socket read) is cut short.
:func:`read_body` reads to the end its framing gives (the ``Content-Length``, or the last chunk),
every handler of egress's servers reads its body with it (the http source, ``egress receiver``,
the throttler service; the Firehose receiver reads its chunks with :func:`request_chunks` and counts
them itself, for its two size caps; its ASGI front end puts its own under :func:`within_deadline`).

Refusals are :class:`RequestBodyError`\\ s, ``status`` the answer to give:

- ``413`` :class:`BodyTooLargeError`: a declared ``Content-Length`` over the limit (before any byte
  of the body is read) or a body that grows over it (reading stops there);
- ``408`` :class:`BodyTimeoutError`: the body not whole ``max_seconds`` after reading began (a
  client that stalls mid-body, or trickles it);
- ``400`` :class:`UnreadableBodyError`: aiohttp could not frame or decode it (bad chunk sizes, a
  ``Content-Encoding`` over bytes that are not in it, the connection ended before the body did);
  :class:`IncompleteBodyError`, one of them: the client ended its side of the connection (its
  FIN) before the body ended, which a server that keeps the connection half-open learns of and
  tells the reader (:func:`client_ended`), so the answer comes at the FIN, not at the deadline;
- ``499`` :class:`ClientClosedError`: the client left mid-body (nobody reads an answer).

Answer a refusal through :func:`closing`: the rest of a refused body may still be on its way, so the
connection is not used again (aiohttp reads and drops what follows for a while, so the client gets
its answer rather than a reset, then closes it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import ClassVar, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from egress.errors import EgressError

DEFAULT_BODY_TIMEOUT = 30.0
"""Seconds a body may take to arrive whole, from the end of its headers: a 1 MiB body at 35 kB/s."""

Response = TypeVar("Response", bound=web.StreamResponse)


class RequestBodyError(EgressError):
    """A request body refused before it was read whole; ``status`` is the HTTP answer's."""

    status: ClassVar[int]


class BodyTooLargeError(RequestBodyError):
    """The body is declared, or grew, over the limit (413 Content Too Large)."""

    status = 413

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"the body is over {max_bytes:,} bytes")


class BodyTimeoutError(RequestBodyError):
    """The body did not arrive whole within its deadline (408 Request Timeout)."""

    status = 408

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the body did not arrive whole within {seconds:g} s")


class UnreadableBodyError(RequestBodyError):
    """aiohttp could not frame or decode the body (400 Bad Request)."""

    status = 400


class IncompleteBodyError(UnreadableBodyError):
    """The client ended its side of the connection before the body ended (400 Bad Request): the
    request is incomplete and will stay so (RFC 9112 section 8)."""

    def __init__(self) -> None:
        super().__init__("the body did not arrive whole: the client ended its side of the connection first "
                         "(nothing of the request is accepted)")


class ClientClosedError(RequestBodyError):
    """The client closed the connection before the body ended; 499 (nginx's), never sent."""

    status = 499

    def __init__(self) -> None:
        super().__init__("client closed the connection before the body ended")


async def request_chunks(request: web.BaseRequest, seconds: float) -> AsyncGenerator[bytes, None]:
    """The body of ``request`` as it arrives, to its end, within ``seconds`` (from this call); raises
    :class:`BodyTimeoutError`, :class:`UnreadableBodyError` or :class:`ClientClosedError`."""
    try:
        async for chunk in within_deadline(_stream_chunks(request), seconds):
            yield chunk
    except (BodyTimeoutError, IncompleteBodyError):
        # Once answered, aiohttp reads and drops what is left of a body for up to its lingering_time
        # (10 s) before it closes the connection, and a server stopping waits for that; a body that
        # timed out, or was cut short, is not coming: its stream ending in a timeout makes aiohttp
        # close at once (another exception there it would log as unhandled).
        request.content.set_exception(TimeoutError())
        raise


def client_ended(request: web.BaseRequest) -> None:
    """The client of ``request`` sends nothing more (its FIN came, on a connection kept half-open
    for the answers): a body not whole by now never will be, so its reader (:func:`read_body`,
    :func:`request_chunks`) raises :class:`IncompleteBodyError` at once, from its next read on. A
    body whole by now (the parser has seen its end, read or not) is left as it is."""
    if not request.content.is_eof():
        request.content.set_exception(IncompleteBodyError())


async def _stream_chunks(request: web.BaseRequest) -> AsyncGenerator[bytes, None]:
    stream = request.content
    while True:
        try:
            chunk = await stream.readany()
        except (HttpProcessingError, web.RequestPayloadError) as error:
            raise UnreadableBodyError(f"cannot read the body: {error.__cause__ or error}") from None
        except ConnectionError:
            raise ClientClosedError from None
        if not chunk:
            return
        yield chunk


async def within_deadline(chunks: AsyncIterator[bytes], seconds: float) -> AsyncGenerator[bytes, None]:
    """``chunks``, each of which must come before ``seconds`` from the first call have passed;
    raises :class:`BodyTimeoutError` then. The deadline is the loop's, the network's real
    time, not a run's clock: a virtual clock skipping idle time would end a body still on its way."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise BodyTimeoutError(seconds) from None
        yield chunk


async def read_body(request: web.BaseRequest, *, max_bytes: int, max_seconds: float) -> bytes:
    """The whole body of ``request``: at most ``max_bytes`` bytes, arrived within ``max_seconds``
    (from this call). Raises a :class:`RequestBodyError` (413, 408, 400, 499; see the module)."""
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise BodyTooLargeError(max_bytes)
    parts: list[bytes] = []
    size = 0
    async with contextlib.aclosing(request_chunks(request, max_seconds)) as chunks:
        async for chunk in chunks:
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLargeError(max_bytes)
            parts.append(chunk)
    return b"".join(parts)


def closing(response: Response) -> Response:
    """``response`` (the answer to a refused body) sent with ``Connection: close``."""
    response.force_close()
    return response
