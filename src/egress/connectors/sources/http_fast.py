"""The http source's lean path: a plain POST of a whole body is parsed and answered from bytes.

aiohttp builds a request object, a task, a stream reader, header multidicts, deadline contexts, a
response object and its headers for every POST: most of the http source's CPU per event
(``docs/benchmarks.md``, session 9). :class:`IngestProtocol` is the source's listening protocol:
for a request that is plainly ``POST <path> HTTP/1.1`` with a ``Content-Length`` and none of the
headers that change its framing or meaning (``Transfer-Encoding``, ``Expect``,
``Content-Encoding``, ``Upgrade``, a ``Connection`` other than ``keep-alive``/``close``), it finds the
body in the bytes received, gives it to the source (:meth:`Ingest.accept_plain`) and, once the
source answers, writes a prebuilt ``200``. Anything else — another method, path or version,
a body over ``max_body_bytes``, a refusal the source would answer (bad JSON, 401, 429), a key whose
first copy is still being committed, or bytes that do not parse (a bare LF or CR in the head
among them) — hands the connection over to
aiohttp's protocol as it stands (:meth:`asyncio.Transport.set_protocol`, the bytes received
replayed), which answers exactly as it does for every request without this path. So the answers
are aiohttp's, and only the common case is shortened.

One request at a time per connection: bytes of a pipelined next request wait (reading paused)
until the pending one is answered, so answers keep the requests' order. A client that ends its
writing side (a FIN: ``shutdown(SHUT_WR)``) has ended its requests, not the connection: every
request whole before the FIN is answered, in order, each once committed, then the connection
closes; a request begun and not whole at the FIN is answered ``400`` (nothing of it accepted), then
the connection closes. A connection handed over to aiohttp (:class:`HalfOpen`) is not told of the
FIN: aiohttp answers every request it reads whole, in order, and closes the connection once idle for
``keepalive_timeout``; a body it is reading, not whole at the FIN, is answered ``400`` then (the
source's handler learns of the FIN through :func:`at_fin`), not ``408`` at ``body_timeout``.

A body not whole when its headers end waits at most ``body_timeout`` seconds (the loop's clock, as
:mod:`egress.http_body`), and so do headers begun and not ended (a client that stalls mid-head, or
sends it a byte at a time, holds no connection for ever), then ``408`` and the connection closes. A
connection with no request begun (just opened, or its last request answered) closes, without an
answer, once idle for ``keepalive_timeout`` seconds (the loop's clock), as aiohttp's does after a
hand-over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable, Iterator
from typing import Protocol

from egress.observe import tracing

READ_AHEAD = 1 << 16
"""Bytes a connection may buffer beyond its pending request before reading pauses, and the largest
header block the lean path parses (a larger one goes to aiohttp, which answers it)."""

_PLAIN_CONNECTION = (b"keep-alive", b"close")
_HANDED_OVER = frozenset((b"transfer-encoding", b"expect", b"content-encoding", b"upgrade", b"te", b"trailer"))
_NOTED = (b"content-length", b"idempotency-key", b"authorization", b"connection", b"traceparent", *_HANDED_OVER)
"""The header names :meth:`IngestProtocol._header` acts on; any other is skipped unread."""
_PLAIN_FIELDS = re.compile(rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n]*)*")
"""The header lines of a plain request, each after its CRLF: a name of token characters (RFC 9110
5.6.2), a colon, a value without CR or LF."""
_NOTED_FIELD = re.compile(rb"\r\n(" + b"|".join(re.escape(name) for name in _NOTED) + rb"):[ \t]*([^\r\n]*)",
                          re.IGNORECASE)
"""One header line :meth:`IngestProtocol._header` acts on: its name (any case) and its value."""


def json_answer(status: int, reason: str, document: dict[str, object], *extra: str) -> bytes:
    """A whole HTTP/1.1 answer: ``status reason``, a JSON body (``json.dumps``, as aiohttp's
    ``json_response``), and ``extra`` header lines."""
    body = json.dumps(document).encode()
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json; charset=utf-8",
            f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Ingest(Protocol):
    """What :class:`IngestProtocol` needs of the source."""

    def accept_plain(self, waiter: IngestProtocol, body: bytes, key: str | None, authorization: bytes | None
                     ) -> tuple[bool, bytes] | None:
        """Take ``body`` (``key``: its ``Idempotency-Key``, ``authorization`` that header's value):
        ``(now, answer)``, the answer to write now (a duplicate's) or once ``waiter`` is told the
        events are committed (:meth:`IngestProtocol.set_result`); ``None`` to hand the request over
        to aiohttp (a refusal it answers, a key still being committed)."""

    def connection_closed(self, protocol: IngestProtocol) -> None:
        """``protocol``'s connection is gone (it is no longer to be closed at the stop)."""


class IngestProtocol(asyncio.Protocol):
    """One connection to the http source (see the module). ``fallback`` makes aiohttp's protocol
    for a connection handed over; ``stopping``: the ``503`` written when the run stops before a
    pending request's events were committed."""

    __slots__ = (
        "_answer",
        "_authorization",
        "_body_timeout",
        "_buffer",
        "_close_after",
        "_eof",
        "_fallback",
        "_handed_over",
        "_head_end",
        "_idle",
        "_idle_until",
        "_keepalive_timeout",
        "_key",
        "_length",
        "_loop",
        "_max_bytes",
        "_paused",
        "_pending",
        "_request_line",
        "_source",
        "_stopping",
        "_timer",
        "_transport",
    )

    def __init__(self, source: Ingest, fallback: Callable[[], asyncio.Protocol], path: str, max_bytes: int,
                 body_timeout: float, stopping: bytes, keepalive_timeout: float) -> None:
        self._source = source
        self._fallback = fallback
        self._request_line = f"POST {path} HTTP/1.1".encode()
        self._max_bytes = max_bytes
        self._body_timeout = body_timeout
        self._answer = b""  # the pending request's answer once committed
        self._stopping = stopping
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._pending = False
        self._paused = False
        self._close_after = False
        self._eof = False  # the client's FIN came: nothing follows what is buffered
        self._handed_over = False
        self._timer: asyncio.TimerHandle | None = None
        self._keepalive_timeout = keepalive_timeout
        self._loop = asyncio.get_running_loop()
        # One idle timer at a time, moved lazily: a request answered only moves _idle_until (no
        # timer made and cancelled per request); the timer, once due, waits on until that time.
        self._idle: asyncio.TimerHandle | None = None
        self._idle_until = 0.0
        self._head_end = -1  # where the headers of the request being read end (-1: not yet seen)
        self._length = 0
        self._key: str | None = None
        self._authorization: bytes | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._idle_from_now()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._pending:
            if not self._paused and len(self._buffer) > READ_AHEAD and self._transport is not None:
                self._paused = True
                self._transport.pause_reading()
            return
        self._next()

    def eof_received(self) -> bool | None:
        self._eof = True
        if self._pending:
            # A half-close after a whole request: its events are accepted, so its answer is written
            # (the client would otherwise send them again), and so are those of the requests
            # buffered behind it (_reply reads on), then the connection closes.
            return True
        if self._buffer:
            self._next()  # a request begun cannot end now: 400 (_incomplete)
        return None  # close: no request follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._cancel_idle()
        self._transport = None
        self._source.connection_closed(self)

    # -- the waiter of a pending request ------------------------------------------------------

    def done(self) -> bool:
        """No request of this connection waits for its answer."""
        return not self._pending

    def set_result(self, _: None) -> None:
        """The pending request's events are committed: answer ``200`` and read the next request."""
        self._reply(self._answer)

    def set_exception(self, _: BaseException) -> None:
        """The run stops before the pending request's events were committed: ``503``, then close."""
        self._close_after = True
        self._reply(self._stopping)

    def close(self) -> None:
        """Close the connection (the run stops)."""
        if self._transport is not None:
            self._transport.close()

    # -- parsing -----------------------------------------------------------------------------

    def _reply(self, answer: bytes) -> None:
        self._pending = False
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(answer)
        if self._close_after:
            transport.close()
            return
        if self._paused:
            self._paused = False
            transport.resume_reading()
        if self._buffer:
            self._next()
        elif self._eof:
            transport.close()  # the client's requests have all been answered
        else:
            self._idle_from_now()

    def _next(self) -> None:
        """Parse what is buffered: answer, wait for more bytes, or hand the connection over."""
        buffer = self._buffer
        if self._head_end < 0:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                # A head over the limit, or one whose lines end in bare LFs (its CRLF CRLF never
                # comes): aiohttp's to answer, rather than a wait for bytes that are not coming.
                if len(buffer) > READ_AHEAD or b"\n\n" in buffer or b"\n\r\n" in buffer:
                    self._hand_over()
                elif buffer:
                    self._wait_for("the request's headers")
                return
            self._cancel_timer()  # the head's; the body has body_timeout of its own from here
            if not self._head(buffer[:end]):
                self._hand_over()
                return
            self._head_end = end + 4
        whole = self._head_end + self._length
        if len(buffer) < whole:
            self._wait_for("the body")
            return
        self._cancel_timer()
        body = buffer[self._head_end:whole]
        taken = self._source.accept_plain(self, body, self._key, self._authorization)
        if taken is None:
            self._hand_over()
            return
        self._buffer = buffer[whole:]
        self._head_end = -1
        self._pending = True  # until answered: _reply clears it and reads on
        now, answer = taken
        if now:
            self._reply(answer)
        else:
            self._answer = answer

    def _head(self, head: bytes) -> bool:
        """Read the request line and headers of ``head``; ``False``: not a plain POST (aiohttp's)."""
        # Each line checked by one C call (the regular expression): a bare LF or CR would hide a header
        # (say "X: a\nTransfer-Encoding: chunked") from a split at CRLF that another reader (aiohttp,
        # a proxy) sees, and a name with a blank or another non-token byte (an obsolete fold, a
        # malformed header) is aiohttp's to answer 400; so is a head with either.
        start = len(self._request_line)
        if not head.startswith(self._request_line) or _PLAIN_FIELDS.fullmatch(head, start) is None:
            return False
        self._length, self._key, self._authorization, self._close_after = -1, None, None, False
        header = self._header
        # Only the headers _header acts on are looked at further (most of a client's are not).
        for field in _NOTED_FIELD.finditer(head, start):
            name, value = field.group(1, 2)
            if not header(name.lower(), value.rstrip(b" \t")):
                return False
        # No length (aiohttp frames the body), or one over the limit (aiohttp answers 413).
        return 0 <= self._length <= self._max_bytes

    def _header(self, name: bytes, value: bytes) -> bool:
        """Note one header; ``False``: the request is not plain."""
        if name == b"content-length":
            if self._length >= 0 or not value.isdigit():
                return False
            self._length = int(value)
        elif name == b"idempotency-key":
            if self._key is not None:
                return False
            self._key = value.decode("utf-8", "surrogateescape")
        elif name == b"authorization":
            self._authorization = value
        elif name == b"connection":
            value = value.lower()
            if value not in _PLAIN_CONNECTION:
                return False
            self._close_after = value == b"close"
        elif name in _HANDED_OVER:
            return False
        elif name == b"traceparent" and tracing.active is not None:
            return False  # tracing on: aiohttp's path reads the trace context (egress.connectors.sources.http)
        return True

    def _wait_for(self, what: str) -> None:
        """The request is not whole yet: wait for more of ``what`` (``"the body"``) within
        ``body_timeout``, or, after the client's FIN, answer that it never will be."""
        if self._eof:
            self._incomplete(what)
        elif self._timer is None:
            self._start_timer(what)

    def _incomplete(self, what: str) -> None:
        """The client's FIN came before the request was whole: ``400``, then close.

        RFC 9112 section 8: a request whose body is shorter than its ``Content-Length`` (or whose
        head has not ended) is incomplete, and "a server that receives an incomplete request message
        ... MAY send an error response prior to closing the connection". One is sent: a client left
        without an answer cannot tell whether its events were accepted (it must send them again
        under a key to be sure), while a 400 says none were; it is a 400, not a 408, as no wait
        would have made the request whole."""
        self._cancel_timer()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(json_answer(400, "Bad Request", {
                "error": f"{what} did not arrive whole: the client ended its side of the connection first "
                         "(nothing of the request is accepted)"},
                "Connection: close"))
            transport.close()

    def _start_timer(self, what: str) -> None:
        """Answer ``408`` and close unless the request is whole within ``body_timeout`` seconds;
        ``what`` (``"the body"``) names the part awaited in the answer."""
        self._timer = self._loop.call_later(self._body_timeout, self._timed_out, what)

    def _timed_out(self, what: str) -> None:
        self._timer = None
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(json_answer(408, "Request Timeout", {
                "error": f"{what} did not arrive whole within {self._body_timeout:g} s (body_timeout)"},
                "Connection: close"))
            transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle_from_now(self) -> None:
        """The connection has no request begun: close it unless one begins within ``keepalive_timeout``."""
        self._idle_until = self._loop.time() + self._keepalive_timeout
        if self._idle is None:
            self._idle = self._loop.call_at(self._idle_until, self._idle_due)

    def _idle_due(self) -> None:
        self._idle = None
        transport = self._transport
        if transport is None or transport.is_closing() or self._pending or self._buffer:
            return  # a request begun: its answer starts the next idle time
        if self._loop.time() < self._idle_until:
            self._idle = self._loop.call_at(self._idle_until, self._idle_due)  # answered since: later
            return
        transport.close()

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _hand_over(self) -> None:
        """From now on aiohttp serves this connection, starting with the bytes buffered."""
        self._cancel_timer()
        self._cancel_idle()
        transport = self._transport
        if transport is None or self._handed_over:
            return
        self._handed_over = True
        protocol = self._fallback()
        transport.set_protocol(HalfOpen(protocol, self._eof))
        self._source.connection_closed(self)
        protocol.connection_made(transport)
        buffer, self._buffer = self._buffer, b""
        if self._paused:
            self._paused = False
            transport.resume_reading()
        if buffer:
            protocol.data_received(buffer)


class HalfOpen(asyncio.Protocol):
    """The protocol of a connection handed over to aiohttp: aiohttp's, not told of the client's FIN.

    aiohttp's protocol closes the connection at the FIN (``shutdown(SHUT_WR)``), so the answers of
    the requests it read whole before it were lost, their events committed (a chunked POST, then a
    FIN, was accepted and never answered). Kept from it, the connection stays half-open (the
    client still reads): aiohttp answers each request, in order, and closes the connection once idle
    for ``keepalive_timeout``, as it does for a client that keeps its writing side open. Only
    ``asyncio.Protocol``'s public methods are passed on. ``ended``: the FIN came before the
    hand-over.

    A handler reading a request's body learns of the FIN through :func:`at_fin`: aiohttp, not told,
    would wait for the rest of a body cut short by it until ``body_timeout`` (a ``408``), while
    nothing more can come.
    """

    __slots__ = ("_at_fin", "_ended", "_protocol")

    def __init__(self, protocol: asyncio.Protocol, ended: bool = False) -> None:
        self._protocol = protocol
        self._ended = ended
        self._at_fin: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._protocol.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._protocol.data_received(data)

    def eof_received(self) -> bool:
        # Every byte before the FIN has been passed on (and parsed) by now: what the callback's
        # request has of its body is all it will get.
        self._ended = True
        if self._at_fin is not None:
            self._at_fin()
        return True  # keep the transport open for the answers still to come

    @contextlib.contextmanager
    def calling_at_fin(self, callback: Callable[[], None]) -> Iterator[None]:
        """Within the block, call ``callback()`` once the client's FIN comes, at once if it came
        before; one callback at a time (aiohttp handles one request of a connection at a time)."""
        self._at_fin = callback
        try:
            if self._ended:
                callback()
            yield
        finally:
            self._at_fin = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self._protocol.pause_writing()

    def resume_writing(self) -> None:
        self._protocol.resume_writing()


def at_fin(transport: asyncio.BaseTransport | None, callback: Callable[[], None]
           ) -> contextlib.AbstractContextManager[None]:
    """Within the block, call ``callback()`` once the client of ``transport``'s connection has
    ended its writing side (at once if it has), when that connection is one aiohttp serves for the
    source (:class:`HalfOpen`); on another (aiohttp's own protocol closes at the FIN), or a
    connection lost (``transport`` ``None``), never."""
    protocol = None if transport is None else transport.get_protocol()
    if isinstance(protocol, HalfOpen):
        return protocol.calling_at_fin(callback)
    return contextlib.nullcontext()
