"""Outgoing HTTP on libcurl's multi interface (pycurl), driven from the asyncio event loop.

One :class:`CurlClient` owns a queue, a cap of running transfers and a pool of reusable easy
handles; the clients of one event loop share that loop's multi handle and connection cache. asyncio
code calls ``await client.send(request)``, or ``submit_many`` with a :class:`Completions` to get the
responses in batches; the loop's driver (:class:`_LoopDriver`) runs the transfers with ``perform`` in
turns on the event loop itself, and hands completions back in batches (one callback per destination
per turn, not per request). Python does as little per request
as it can: ``Retry-After`` is read from libcurl once a 429 or 503 transfer ended
(``egress.httpclient.header_api``), with no header callback; other headers are kept (by the C
``list.append``, one call per line) only when a request asks for one, and decoded only once the
transfer ends; no per-socket callbacks. Why the event loop rather than a thread of its own:
a thread of its own was measured to cost more CPU per message in wake-ups and GIL hand-offs than the
loop's turns cost (``docs/benchmarks.md``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NamedTuple

import pycurl

from egress.httpclient.header_api import AVAILABLE as HEADER_API
from egress.httpclient.header_api import final_header
from egress.httpclient.proxy import proxy_options
from egress.httpclient.retry_after import RETRY_AFTER_STATUSES
from egress.version import __version__


class Request(NamedTuple):
    """One HTTP exchange: ``method`` ``POST`` (with ``body``) or ``GET`` (``body`` ignored).

    ``headers`` are ``"Name: value"`` lines sent as given; ``timeout`` (seconds) bounds the whole
    attempt from the moment the transfer starts: connect, send, response and full body read.
    ``capture_body`` keeps the response body (the default discards it after reading it all);
    ``capture_location`` keeps the raw ``Location`` header (redirects are never followed here);
    ``capture_headers`` keeps every header of the final response; ``capture_retry_after`` keeps the
    raw ``Retry-After`` header of a 429 or 503 response (of no other status); ``capture_local_port``
    (the default) reports the client port the transfer used.
    """

    url: str
    body: bytes = b""
    headers: tuple[str, ...] = ()
    timeout: float = 10.0
    capture_body: bool = False
    capture_location: bool = False
    capture_headers: bool = False
    method: str = "POST"
    capture_retry_after: bool = False
    prepared: bool = False  # ``headers`` came from post_header_lines: sent exactly as they are
    capture_local_port: bool = True  # False: ``Response.local_port`` is 0 (one libcurl query less)


def post_header_lines(headers: Iterable[str], added_names: Iterable[str] = ()) -> tuple[str, ...]:
    """The header lines libcurl gets for a POST with ``headers``: libcurl adds ``Content-Type:
    application/x-www-form-urlencoded`` to a POST and ``Expect: 100-continue`` to large bodies, but
    payloads go as they are, so both are removed (empty lines) unless a Content-Type is given.

    A sender whose headers do not change builds them once and sends each request with
    ``prepared=True``; ``added_names`` are the headers it adds to each request itself (such as an
    idempotency key), which count as given here."""
    lines = tuple(headers)
    if not any(line[:13].lower() == "content-type:" for line in lines) and not any(
            name.lower() == "content-type" for name in added_names):
        lines += ("Content-Type:",)
    return (*lines, "Expect:")


class Response(NamedTuple):
    """The outcome of one attempt.

    ``status`` is the HTTP status, 0 when no response arrived. ``error`` is ``None`` on a complete
    exchange, else libcurl's description (``"curl error 28: ..."``); both are set when a status
    arrived but the body read then failed. ``location`` is the raw ``Location`` header when the
    request asked for it, ``headers`` the response's headers (lower-case names; a repeated header
    keeps its last value) when the request asked for them, ``local_port`` the client port used (0
    when the request did not ask for it);
    ``retry_after`` the raw ``Retry-After`` value of a 429 or 503 when the request asked for it.
    Why a failed attempt failed, as a type: ``egress.httpclient.outcomes.failure_of``.
    """

    status: int
    error: str | None = None
    body: bytes | None = None
    location: str | None = None
    headers: dict[str, str] | None = None
    local_port: int = 0
    retry_after: str | None = None
    curl_code: int = 0  # libcurl's CURLcode of ``error`` (0: none); egress.httpclient.outcomes classifies it

    @property
    def ok(self) -> bool:
        """A 2xx with the body read completely."""
        return self.error is None and 200 <= self.status <= 299


CLIENT_CLOSED = "client closed"  # the error of a request still pending when its client closed


class Completions(NamedTuple):
    """Where finished transfers go, a batch at a time: ``callback`` gets ``[(token, response), ...]`` on
    ``loop`` (one call per driver turn for all of a client's transfers that finished together, not a
    future per request). ``cancelled(token)`` is asked before a queued request starts: True drops it
    unsent, and its token gets no response. A sender builds one and reuses it."""

    loop: asyncio.AbstractEventLoop
    callback: Callable[[list[tuple[Any, Response]]], None]
    cancelled: Callable[[Any], bool]


_new_tuple = tuple.__new__
# libcurl's own flags for a CURLOPT_URL string (curl's lib/url.c), so a parsed URL means the same.
_URL_FLAGS = pycurl.U_GUESS_SCHEME | pycurl.U_NON_SUPPORT_SCHEME
_PARSED_URLS = 1024  # parsed URLs a client keeps
USER_AGENT = f"egress/{__version__}"
"""The ``User-Agent`` of every request egress sends (unless its own headers give one)."""

_Entry = tuple[Request, Any]  # a request and its token, as the sender handed them over
# Finished transfers by destination: id(completions) -> (completions, [(token, response), ...])
_Batches = dict[int, tuple[Completions, list[tuple[Any, Response]]]]

class CurlClient:
    """An HTTP client on its loop's libcurl multi handle; safe to use from one asyncio loop.

    ``max_connections`` caps concurrent transfers (more wait in a queue, and their timeout starts
    only when they start) and, with ``keep_alive``, is also what the client adds to the size of the
    loop's connection cache, so a client never has more than ``max_connections`` connections busy,
    the loop's clients together never keep more idle than the sum of their pools, and connections are
    reused (a cache smaller than the concurrency makes libcurl close a connection after every
    request; see ``docs/architecture.md``); ``keep_alive=False`` forbids reuse; ``verify_tls`` keeps
    certificate and host verification on (the default, and what production must use);
    ``ca_file`` is a PEM bundle of certificate authorities to trust instead of libcurl's default.
    The proxy environment variables (``http_proxy``, ``https_proxy``, ``all_proxy``, ``no_proxy``
    and their upper-case forms, by libcurl's rules: ``egress.httpclient.proxy``) are read once, here.

    Every client of an event loop is driven by that loop's :class:`_LoopDriver`, bound at the first
    request: use a client from one loop only.
    """

    def __init__(
        self,
        *,
        max_connections: int = 64,
        keep_alive: bool = True,
        verify_tls: bool = True,
        ca_file: str | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.max_connections = max_connections
        self.keep_alive = keep_alive
        self.verify_tls = verify_tls
        self.ca_file = ca_file
        self._driver: _LoopDriver | None = None  # the driver of the loop of the first request
        self._queued: collections.deque[_Entry] = collections.deque()
        # Where each queued request's response goes, in the queue's order: the sender's own pairs are
        # queued as they are (no tuple per request), their Completions beside them.
        self._destinations: collections.deque[Completions] = collections.deque()
        # Easy handles are keys by identity (pycurl defines no equality): no id() call per lookup.
        # handle -> the queue entry it runs, where its response goes and what its callbacks capture
        # (None: nothing)
        self._running: dict[pycurl.Curl, tuple[_Entry, Completions, _Capture | None]] = {}
        self._futures: Completions | None = None  # where submit()'s futures are resolved
        self._spare_handles: list[pycurl.Curl] = []
        self._captures: dict[pycurl.Curl, _Capture] = {}  # what a handle's callbacks capture, once it captured
        self._handle_options: dict[pycurl.Curl, tuple[str, float]] = {}  # a handle's URL and timeout (seconds)
        # URL -> libcurl's parse of it (None: libcurl rejects it), shared by the handles: a handle given
        # a parsed URL (CURLOPT_CURLU) copies it at each transfer instead of parsing the string again.
        self._parsed_urls: dict[str, pycurl.CurlUrl | None] = {}
        # Read once: libcurl would call getenv five times per transfer (egress.httpclient.proxy).
        self._proxy_options = proxy_options(os.environ)
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Transfers running or queued in this client."""
        return len(self._running) + len(self._queued)

    async def send(self, request: Request) -> Response:
        """Run ``request``; returns its :class:`Response` (never raises for HTTP or transport errors).

        Raises ``RuntimeError`` if the client is closed.
        """
        return await self.submit(request)

    def submit(self, request: Request) -> asyncio.Future[Response]:
        """Start ``request`` and return the future of its :class:`Response`, resolved on the running
        loop; cancelling the future drops the request if it has not started. Raises ``RuntimeError``
        if the client is closed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Response] = loop.create_future()
        completions = self._futures
        if completions is None or completions.loop is not loop:
            completions = self._futures = Completions(loop, resolve_futures, asyncio.Future.cancelled)
        self.submit_many(((request, future),), completions)
        return future

    def submit_many(self, requests: Iterable[tuple[Request, Any]], completions: Completions) -> None:
        """Start each ``(request, token)``; their responses reach ``completions`` in batches (see
        :class:`Completions`), each exactly once unless cancelled before it started. Call it on
        ``completions.loop``. Raises ``RuntimeError`` if the client is closed."""
        if self._closed:
            raise RuntimeError("CurlClient is closed")
        driver = self._driver
        if driver is None:
            driver = self._driver = _LoopDriver.of(completions.loop)
            driver.attach(self)
        queued = self._queued
        before = len(queued)
        try:
            queued.extend(requests)
        finally:  # whatever was queued (``requests`` may be a generator that raises) has its destination
            self._destinations.extend(itertools.repeat(completions, len(queued) - before))
        # Requests submitted in one pass of the event loop start together, in the driver's next turn.
        driver.wake()

    def close(self) -> None:
        """Release every handle; requests still pending get the error ``CLIENT_CLOSED``."""
        if self._closed:
            return
        self._closed = True
        leftovers = list(zip(self._queued, self._destinations, strict=True))
        self._queued.clear()
        self._destinations.clear()
        if self._driver is not None:
            self._driver.detach(self)
        _complete([(completions, token, Response(0, CLIENT_CLOSED)) for (_, token), completions in leftovers])

    # -- run by the driver's turns -------------------------------------------------------------

    def _release(self, multi: pycurl.CurlMulti) -> None:
        """Abort running transfers and free libcurl's handles (the client is closed)."""
        for handle, ((_, token), completions, _) in self._running.items():
            multi.remove_handle(handle)
            handle.close()
            _complete([(completions, token, Response(0, CLIENT_CLOSED))])
        self._running.clear()
        for handle in self._spare_handles:
            handle.close()
        self._spare_handles.clear()
        self._captures.clear()
        self._handle_options.clear()

    def _start_queued(self, multi: pycurl.CurlMulti, owners: dict[pycurl.Curl, CurlClient]) -> bool:
        """Start queued requests on the driver's ``multi`` while below ``max_connections``, each
        handle noted in ``owners``; True if any started."""
        started = False
        queued, destinations, running = self._queued, self._destinations, self._running
        spare, configure = self._spare_handles, self._configure
        cap = self.max_connections
        add_handle = multi.add_handle
        while queued and len(running) < cap:
            entry = queued.popleft()
            completions = destinations.popleft()
            request, token = entry
            if completions.cancelled(token):
                continue
            handle = spare.pop() if spare else self._new_handle()
            running[handle] = (entry, completions, configure(handle, request))
            owners[handle] = self
            add_handle(handle)
            started = True
        return started

    def _new_handle(self) -> pycurl.Curl:
        """An easy handle with the options that never change for this client, set once."""
        handle = pycurl.Curl()
        handle.setopt(pycurl.NOSIGNAL, 1)
        # pycurl's default names its own build ("PycURL/7.45 libcurl/8.x OpenSSL/…"); a request's own
        # User-Agent header (a sink's headers) still wins over this.
        handle.setopt(pycurl.USERAGENT, USER_AGENT)
        handle.setopt(pycurl.FOLLOWLOCATION, 0)
        handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        handle.setopt(pycurl.FORBID_REUSE, 0 if self.keep_alive else 1)
        handle.setopt(pycurl.SSL_VERIFYPEER, 1 if self.verify_tls else 0)
        handle.setopt(pycurl.SSL_VERIFYHOST, 2 if self.verify_tls else 0)
        if self.ca_file is not None:
            handle.setopt(pycurl.CAINFO, self.ca_file)
        handle.setopt(pycurl.WRITEFUNCTION, _discard)
        handle.setopt(pycurl.NOPROXY, self._proxy_options.no_proxy)
        return handle

    def _set_url(self, handle: pycurl.Curl, url: str) -> None:
        """Point ``handle`` at ``url`` (parsed once per client) and at the proxy the environment gives
        its scheme."""
        parsed = self._parsed_urls.get(url, False)
        if parsed is False:
            if len(self._parsed_urls) >= _PARSED_URLS:  # a webhook sink's many endpoints: start over
                self._parsed_urls.clear()
            try:
                parsed = pycurl.CurlUrl(url, _URL_FLAGS)
            except pycurl.error:
                parsed = None
            self._parsed_urls[url] = parsed
        if parsed is None:
            # A URL libcurl's parser rejects: the transfer fails with libcurl's own error, as it would.
            handle.setopt(pycurl.CURLU, None)
            handle.setopt(pycurl.URL, url)
            scheme = url.partition("://")[0].lower()
        else:
            handle.setopt(pycurl.CURLU, parsed)
            scheme = parsed.scheme or ""
        # None: libcurl reads the <scheme>_proxy variables itself, for a scheme egress does not choose for.
        handle.setopt(pycurl.PROXY, self._proxy_options.proxies.get(scheme))

    def _configure(self, handle: pycurl.Curl, request: Request) -> _Capture | None:
        """Set the per-request options of ``handle``; the capture of the response, None when nothing
        is kept."""
        # A sink sends every request to one URL with one timeout: set them only when they change.
        options = self._handle_options.get(handle)
        if options is None or options[0] != request.url or options[1] != request.timeout:
            if options is None or options[0] != request.url:
                self._set_url(handle, request.url)
            handle.setopt(pycurl.TIMEOUT_MS, max(1, int(request.timeout * 1000)))
            self._handle_options[handle] = (request.url, request.timeout)
        if request.method == "GET":
            handle.setopt(pycurl.HTTPGET, 1)
            handle.setopt(pycurl.HTTPHEADER, request.headers)
        else:
            # pycurl sets POSTFIELDSIZE from the bytes object itself (a body may hold NUL bytes).
            handle.setopt(pycurl.POSTFIELDS, request.body)
            headers = request.headers if request.prepared else post_header_lines(request.headers)
            handle.setopt(pycurl.HTTPHEADER, headers)
        capture_body = request.capture_body
        # Retry-After alone is read from libcurl once the transfer ends (header_api), not line by line.
        wants_headers = request.capture_location or request.capture_headers or (
            request.capture_retry_after and not HEADER_API)
        capture = self._captures.get(handle)
        if not (capture_body or wants_headers):
            if capture is not None and (capture.body_on or capture.headers_on):
                capture.switch(handle, False, False)  # only a handle that captured before is reset
            return None
        if capture is None:
            capture = self._captures[handle] = _Capture()
        # The handle's own lists, emptied: its callbacks stay set while its requests keep asking for
        # the same (the sink's ask for Retry-After), so a request costs no setopt for them.
        capture.request = request
        capture.lines.clear()
        if capture_body:
            capture.chunks.clear()
        if capture.body_on != capture_body or capture.headers_on != wants_headers:
            capture.switch(handle, bool(capture_body), bool(wants_headers))
        capture.retry_after_only = not (capture_body or request.capture_location or request.capture_headers)
        return capture

    def _finish(self, handle: pycurl.Curl, error: str | None, code: int, batches: _Batches) -> None:
        """Add the response of ``handle``'s finished transfer (already removed from the multi handle)
        to the batch of its destination in ``batches``."""
        (request, token), completions, capture = self._running.pop(handle)
        status: int = handle.getinfo(pycurl.RESPONSE_CODE)
        local_port = max(0, handle.getinfo(pycurl.LOCAL_PORT) or 0) if request.capture_local_port else 0
        self._spare_handles.append(handle)
        if capture is None or (capture.retry_after_only and status not in RETRY_AFTER_STATUSES):
            retry_after = None
            if status in RETRY_AFTER_STATUSES and request.capture_retry_after:
                retry_after = final_header(handle, b"Retry-After")  # only with HEADER_API: else captured
            # tuple.__new__: a Response without the NamedTuple's Python-level __new__ (per request)
            response = _new_tuple(Response, (status, error, None, None, None, local_port, retry_after, code))
        else:
            location, headers, retry_after = capture.headers(status)
            if HEADER_API and request.capture_retry_after and status in RETRY_AFTER_STATUSES:
                retry_after = final_header(handle, b"Retry-After")
            body = b"".join(capture.chunks) if request.capture_body else None
            response = Response(status, error, body, location, headers, local_port, retry_after, code)
        batch = batches.get(id(completions))
        if batch is None:
            batch = batches[id(completions)] = (completions, [])
        batch[1].append((token, response))


class _LoopDriver:
    """Drives every :class:`CurlClient` of one event loop from that loop, without a thread, on one
    libcurl multi handle for all of them: a turn (start queued requests, one ``perform``, hand
    completions back) runs when requests are submitted and, while transfers run, on a timer: every
    ``MIN_PERIOD`` until ``PATIENCE`` turns in a row finished nothing (a loopback or LAN answer comes
    within that), then doubling up to ``MAX_PERIOD`` (a slow endpoint costs at most 1 / ``MAX_PERIOD``
    turns a second, and each answer waits at most that long to be seen). libcurl's timeouts are
    checked by every ``perform``. No socket is registered with the loop: a descriptor that libcurl
    closes and the kernel reuses within one turn could not be told from the old one.

    One multi handle rather than one per client: a turn costs one ``perform`` and one ``info_read``
    however many clients (sinks, partitions) the loop runs, and the completions of every client go
    back in one batch per destination. Each client keeps its own cap of running transfers and its
    own queue; the multi's connection cache holds the sum of the clients' pools (a keep-alive
    client's ``max_connections``), so the loop's clients together hold at most that many idle
    connections, and a client may reuse a connection another client of the loop opened to the same
    endpoint with the same TLS settings (libcurl matches them)."""

    MIN_PERIOD = 0.0005
    MAX_PERIOD = 0.004
    PATIENCE = 8
    _drivers: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopDriver]] = \
        weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _LoopDriver:
        driver = cls._drivers.get(loop)
        if driver is None:
            driver = cls._drivers[loop] = cls(loop)
        return driver

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # A proxy: a driver holding its loop would keep the loop (its key in _drivers) alive for ever.
        self._loop = weakref.proxy(loop)
        self._clients: list[CurlClient] = []
        self._multi: pycurl.CurlMulti | None = None  # while a client is attached
        self._owners: dict[pycurl.Curl, CurlClient] = {}  # easy handle -> the client whose transfer it runs
        self._soon = False  # a turn is scheduled with call_soon
        self._timer: asyncio.TimerHandle | None = None
        self._period = self.MIN_PERIOD
        self._empty_turns = 0  # turns in a row that finished no transfer
        self.turns = 0

    def attach(self, client: CurlClient) -> None:
        self._clients.append(client)
        if self._multi is None:
            self._multi = pycurl.CurlMulti()
        self._size_cache(self._multi)

    def detach(self, client: CurlClient) -> None:
        if client in self._clients:
            self._clients.remove(client)
        multi = self._multi
        if multi is None:
            return
        for handle in [handle for handle, owner in self._owners.items() if owner is client]:
            del self._owners[handle]
        client._release(multi)
        if self._clients:
            self._size_cache(multi)
        else:
            # The last client: its connections close now, as a client's close promises.
            multi.close()
            self._multi = None

    def _size_cache(self, multi: pycurl.CurlMulti) -> None:
        pooled = sum(client.max_connections for client in self._clients if client.keep_alive)
        multi.setopt(pycurl.M_MAXCONNECTS, max(1, pooled))

    def wake(self) -> None:
        if not self._soon:
            self._soon = True
            self._period = self.MIN_PERIOD
            self._empty_turns = 0
            self._loop.call_soon(self._turn)

    def _tick(self) -> None:
        self._timer = None
        self._turn()

    def _turn(self) -> None:
        self._soon = False
        self.turns += 1
        multi = self._multi
        finished = False
        if multi is not None:
            finished = self._drive(multi)
        if finished:
            self._empty_turns = 0
            self._period = self.MIN_PERIOD
        else:
            self._empty_turns += 1
            if self._empty_turns > self.PATIENCE:
                self._period = min(self._period * 2, self.MAX_PERIOD)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._owners:
            self._timer = self._loop.call_later(self._period, self._tick)

    def _drive(self, multi: pycurl.CurlMulti) -> bool:
        """Start queued requests, let libcurl do what its sockets and timers allow, hand completions
        back; True if any transfer finished. Completions free slots for queued requests, and starting
        those may complete some at once (a refused connection): repeat until neither happens, or a
        queue could stall."""
        owners = self._owners
        self._start_queued(multi)
        finished = False
        while True:
            if owners:
                while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                    pass
            if not self._collect(multi):
                return finished
            finished = True
            if not self._start_queued(multi):
                return finished

    def _start_queued(self, multi: pycurl.CurlMulti) -> bool:
        started = False
        owners = self._owners
        for client in self._clients:
            if client._queued and client._start_queued(multi, owners):
                started = True
        return started

    def _collect(self, multi: pycurl.CurlMulti) -> bool:
        """Hand finished transfers back to their loops, one batch per destination; True if any finished."""
        batches: _Batches = {}
        owners = self._owners
        remove_handle = multi.remove_handle
        while True:
            queued, succeeded, failed = multi.info_read()
            for handle in succeeded:
                remove_handle(handle)
                owners.pop(handle)._finish(handle, None, 0, batches)
            for handle, errno, message in failed:
                remove_handle(handle)
                owners.pop(handle)._finish(handle, f"curl error {errno}: {message}", errno, batches)
            if not queued:
                break
        if batches:
            _hand_over(batches)
        return bool(batches)


class _Capture:
    """What a handle's transfers keep of their responses, one transfer at a time: the body chunks
    (``body_on``: the handle's write callback appends to ``chunks``) and every header line as libcurl
    hands it over (``headers_on``: its header callback appends to ``lines``), for ``request``, the
    transfer running now. The lists and callbacks belong to the handle and are reused."""

    __slots__ = ("body_on", "chunks", "headers_on", "lines", "request", "retry_after_only")

    def __init__(self) -> None:
        self.request: Request | None = None
        self.chunks: list[bytes] = []
        self.lines: list[bytes] = []
        self.body_on = False
        self.headers_on = False
        self.retry_after_only = False  # the request keeps only Retry-After: other statuses need no capture

    def switch(self, handle: pycurl.Curl, body: bool, headers: bool) -> None:
        """Set ``handle``'s callbacks to capture the body and the header lines, or not."""
        if body != self.body_on:
            self.chunks.clear()
            handle.setopt(pycurl.WRITEFUNCTION, self.chunks.append if body else _discard)
            self.body_on = body
        if headers != self.headers_on:
            handle.setopt(pycurl.HEADERFUNCTION, self.lines.append if headers else None)
            self.headers_on = headers

    def headers(self, status: int) -> tuple[str | None, dict[str, str] | None, str | None]:
        """``Location``, every header and ``Retry-After`` of the final response, each only when the
        request asked for it (``Retry-After`` only for a 429 or 503). The lines are decoded only when
        one of them is wanted, so a request that captures ``Retry-After`` costs one C call per line."""
        request = self.request
        assert request is not None
        wants_retry_after = request.capture_retry_after and status in RETRY_AFTER_STATUSES
        if not (request.capture_location or request.capture_headers or wants_retry_after):
            return None, None, None
        found = _final_headers(self.lines)
        return (found.get("location") if request.capture_location else None,
                found if request.capture_headers else None,
                found.get("retry-after") if wants_retry_after else None)


def _final_headers(lines: list[bytes]) -> dict[str, str]:
    """The headers of the last response among ``lines`` (an interim response such as 100 Continue
    starts over at its status line): lower-case names, a repeated header keeps its last value."""
    first = 0
    for index, line in enumerate(lines):
        if line[:5] == b"HTTP/":
            first = index + 1
    headers: dict[str, str] = {}
    for line in lines[first:]:
        name, colon, value = line.decode("latin-1").partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return headers


# The write callback of a body that is not kept: a C builtin (no Python frame per chunk) returning what
# libcurl must hear, the count of bytes taken (pycurl: None or that count).
_discard: Callable[[bytes], int] = len


def _complete(done: list[tuple[Completions, Any, Response]]) -> None:
    """Hand ``done`` to each :class:`Completions` on its loop: one call per destination."""
    batches: _Batches = {}
    for completions, token, response in done:
        batch = batches.get(id(completions))
        if batch is None:
            batch = batches[id(completions)] = (completions, [])
        batch[1].append((token, response))
    _hand_over(batches)


def _hand_over(batches: _Batches) -> None:
    """Call each destination's callback with its batch, on its loop (one call per destination)."""
    for completions, batch in batches.values():
        if not completions.loop.is_closed():
            completions.loop.call_soon(completions.callback, batch)


def resolve_futures(batch: list[tuple[asyncio.Future[Response], Response]]) -> None:
    """The :class:`Completions` callback of ``submit``: each token is the future of its response."""
    for future, response in batch:
        if not future.done():
            future.set_result(response)
