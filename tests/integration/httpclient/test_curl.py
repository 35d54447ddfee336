"""The libcurl multi client against real loopback servers: queueing, reuse, errors."""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from aiohttp import web
from multidict import CIMultiDict

from egress.httpclient import CurlClient, Request
from egress.httpclient import curl as curl_module
from egress.httpclient.curl import post_header_lines
from egress.httpclient.outcomes import FailureKind, failure_of
from tests.conftest import ServerFactory

pytestmark = pytest.mark.integration


def echo_app(delay: float = 0.0) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        if delay:
            await asyncio.sleep(delay)
        return web.Response(body=body[::-1], status=int(request.query.get("status", "200")))

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    return app


async def test_requests_beyond_the_connection_cap_wait_and_all_complete(serve_app: ServerFactory) -> None:
    base = await serve_app(echo_app(delay=0.01))
    client = CurlClient(max_connections=1)
    try:
        responses = await asyncio.wait_for(
            asyncio.gather(*(client.send(Request(f"{base}/x", str(i).encode(), capture_body=True))
                             for i in range(20))), timeout=20)
    finally:
        client.close()
    assert [r.body for r in responses] == [str(i).encode()[::-1] for i in range(20)]
    assert all(r.ok for r in responses)


async def test_keep_alive_reuses_one_connection_and_without_it_each_request_opens_one(
        serve_app: ServerFactory) -> None:
    base = await serve_app(echo_app())
    reused = CurlClient(max_connections=1, keep_alive=True)
    fresh = CurlClient(max_connections=1, keep_alive=False)
    try:
        kept = {(await reused.send(Request(f"{base}/x", b"a"))).local_port for _ in range(10)}
        new = {(await fresh.send(Request(f"{base}/x", b"a"))).local_port for _ in range(10)}
    finally:
        reused.close()
        fresh.close()
    assert len(kept) == 1
    assert len(new) == 10


async def test_the_clients_of_one_loop_share_its_connections(serve_app: ServerFactory) -> None:
    """One multi handle per event loop: a client reuses the idle connection another client of the
    same loop left to the same endpoint, and each still runs at most its own cap at once."""
    base = await serve_app(echo_app(delay=0.01))
    first = CurlClient(max_connections=1)
    second = CurlClient(max_connections=1)
    try:
        port = (await first.send(Request(f"{base}/x", b"a"))).local_port
        assert (await second.send(Request(f"{base}/x", b"b"))).local_port == port
        responses = await asyncio.gather(*(client.send(Request(f"{base}/x", b"c"))
                                           for client in (first, second) for _ in range(5)))
    finally:
        first.close()
        second.close()
    assert all(r.ok for r in responses)
    assert len({r.local_port for r in responses}) <= 2  # two clients, one connection each at most


async def test_an_idle_client_with_a_cached_connection_does_not_spin_the_driver(
        serve_app: ServerFactory) -> None:
    """Between requests the loop's curl driver runs no turn: no transfers, no timer."""
    from egress.httpclient.curl import _LoopDriver

    base = await serve_app(echo_app())
    client = CurlClient(max_connections=2)
    try:
        assert (await client.send(Request(f"{base}/x", b"a"))).ok
        driver = _LoopDriver.of(asyncio.get_running_loop())
        # The driver's own state: no turn queued, no timer, no transfer, so no turn runs until a
        # request wakes it (a timer left behind would spin it however short a wait were watched).
        assert (driver._soon, driver._timer, driver._owners) == (False, None, {})
        turns = driver.turns
        for _ in range(10):  # turns of the loop, not time
            await asyncio.sleep(0)
        assert driver.turns == turns
        assert (await client.send(Request(f"{base}/x", b"b"))).ok  # and a new request still wakes it
    finally:
        client.close()


def test_a_closed_event_loop_and_its_curl_driver_are_released(unused_tcp_port: int) -> None:
    """The driver of a loop does not keep the loop alive once nothing else does (a process running
    one loop after another, such as a test suite, must not keep every old loop)."""
    import gc
    import weakref

    from egress.httpclient.curl import _LoopDriver

    async def one_request() -> None:
        client = CurlClient()
        try:
            await client.send(Request(f"http://127.0.0.1:{unused_tcp_port}/", b"a", timeout=1.0))  # refused
        finally:
            client.close()

    gc.collect()
    drivers = len(_LoopDriver._drivers)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(one_request())
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None
    assert len(_LoopDriver._drivers) == drivers


async def test_transfers_on_descriptors_above_fd_setsize_complete(serve_app: ServerFactory) -> None:
    """libcurl's fdset() leaves out descriptors >= 1024: a process holding that many files must
    still complete its requests promptly, not at their timeout (found by review)."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1300:
        pytest.skip("the open-files limit is too low to hold 1,100 descriptors")
    base = await serve_app(echo_app())
    held: list[int] = []
    client = CurlClient(max_connections=2, keep_alive=False)
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        responses = await asyncio.wait_for(asyncio.gather(
            *(client.send(Request(f"{base}/x", str(i).encode(), timeout=60, capture_body=True)) for i in range(6))),
            timeout=15)
    finally:
        client.close()
        for fd in held:
            os.close(fd)
    assert [r.body for r in responses] == [str(i).encode()[::-1] for i in range(6)]


async def test_status_codes_are_reported_as_received(serve_app: ServerFactory) -> None:
    base = await serve_app(echo_app())
    client = CurlClient()
    try:
        for status in (200, 204, 299, 404, 503):
            response = await client.send(Request(f"{base}/x?status={status}", b"a"))
            assert response.status == status
            assert response.error is None
            assert response.ok is (200 <= status <= 299)
    finally:
        client.close()


async def test_refused_connection_is_a_transport_error(unused_tcp_port: int) -> None:
    client = CurlClient()
    try:
        response = await client.send(Request(f"http://127.0.0.1:{unused_tcp_port}/", b"a"))
    finally:
        client.close()
    assert response.status == 0
    assert (response.error or '').startswith("curl error 7:")
    assert not response.ok
    failure = failure_of(response)
    assert failure is not None
    assert (failure.kind, failure.curl_code) == (FailureKind.CONNECT, 7)


async def test_attempt_timeout_covers_a_stalled_response(serve_app: ServerFactory) -> None:
    base = await serve_app(echo_app(delay=2.0))
    client = CurlClient()
    try:
        response = await client.send(Request(f"{base}/x", b"a", timeout=0.2))
    finally:
        client.close()
    assert response.status == 0
    assert (response.error or '').startswith("curl error 28:")
    assert response.curl_code == 28
    failure = failure_of(response)
    assert failure is not None
    assert failure.kind is FailureKind.TIMEOUT


async def test_a_truncated_body_keeps_the_status_and_reports_the_read_error() -> None:
    """A 200 whose body ends early is not a success (upstream: RetriesResponseReadFailureAndCountsIt)."""

    async def truncated(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-part")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(truncated, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = CurlClient()
    try:
        response = await client.send(Request(f"http://127.0.0.1:{port}/", b""))
    finally:
        client.close()
        server.close()
        await server.wait_closed()
    assert response.status == 200
    assert (response.error or '').startswith("curl error 18:")
    assert not response.ok


async def test_a_closed_client_refuses_new_requests() -> None:
    client = CurlClient()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        await client.send(Request("http://127.0.0.1:1/", b""))


async def test_attempt_timeout_covers_a_stalled_response_body() -> None:
    """Headers arrive, then the body stalls: the attempt still ends at its deadline
    (upstream TimesOutStalledResponseBodyByAttemptDeadline)."""
    release = asyncio.Event()

    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab")
        await writer.drain()
        await release.wait()
        writer.close()

    server = await asyncio.start_server(stalls, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = CurlClient()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        response = await client.send(Request(f"http://127.0.0.1:{port}/", b"", timeout=0.3))
    finally:
        release.set()
        client.close()
        server.close()
        await server.wait_closed()
    assert 0.25 <= loop.time() - started < 2.0
    assert response.status == 200
    assert (response.error or "").startswith("curl error 28:")


async def test_response_headers_are_captured_on_request(serve_app: ServerFactory) -> None:
    async def handle(request: web.Request) -> web.Response:
        return web.json_response({"requestId": "r"}, headers={"X-Trace": "abc", "Location": "/next"}, status=302)

    app = web.Application()
    app.router.add_post("/", handle)
    base = await serve_app(app)
    client = CurlClient()
    try:
        plain = await client.send(Request(f"{base}/", b""))
        full = await client.send(Request(f"{base}/", b"", capture_headers=True, capture_body=True))
        location = await client.send(Request(f"{base}/", b"", capture_location=True))
    finally:
        client.close()
    assert plain.headers is None
    assert plain.location is None
    assert full.headers is not None
    assert full.headers["x-trace"] == "abc"
    assert full.headers["content-type"].startswith("application/json")
    assert full.body == b'{"requestId": "r"}'
    assert location.location == "/next"
    assert location.headers is None


async def test_retry_after_is_kept_only_for_a_429_or_503_that_asked_for_it(serve_app: ServerFactory) -> None:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(status=int(request.query["status"]), headers={"Retry-After": " 120 ", "X-Other": "x"})

    app = web.Application()
    app.router.add_post("/", handle)
    base = await serve_app(app)
    client = CurlClient()
    try:
        answers = {status: await client.send(Request(f"{base}/?status={status}", b"", capture_retry_after=True))
                   for status in (429, 503, 500, 200, 301)}
        unasked = await client.send(Request(f"{base}/?status=503", b""))
        with_location = await client.send(Request(f"{base}/?status=503", b"", capture_location=True,
                                                  capture_retry_after=True))
    finally:
        client.close()
    assert {status: r.retry_after for status, r in answers.items()} == {
        429: "120", 503: "120", 500: None, 200: None, 301: None}
    assert all(r.headers is None and r.location is None for r in answers.values())
    assert unasked.retry_after is None
    assert (with_location.retry_after, with_location.location) == ("120", None)


@pytest.mark.parametrize("header_api", [True, False], ids=["libcurl header API", "header callback"])
async def test_retry_after_is_the_final_responses_last_value_whether_read_from_libcurl_or_by_callback(
        serve_app: ServerFactory, monkeypatch: pytest.MonkeyPatch, header_api: bool) -> None:
    """libcurl's ``curl_easy_header`` after the transfer (no per-line callback) and the header
    callback (the fallback where the header API cannot be proven) give the same values: the last of
    repeated headers, a date as sent, nothing for a later exchange on the same handle without one."""
    if header_api and not curl_module.HEADER_API:
        pytest.skip("libcurl's header API is not available with this pycurl")
    monkeypatch.setattr(curl_module, "HEADER_API", header_api)

    async def handle(request: web.Request) -> web.Response:
        values = request.query.getall("after", [])
        headers = CIMultiDict(("Retry-After", value) for value in values)
        return web.Response(status=int(request.query["status"]), headers=headers, body=b"busy")

    app = web.Application()
    app.router.add_post("/", handle)
    base = await serve_app(app)
    client = CurlClient(max_connections=1)  # one easy handle: each answer must be its own exchange's
    date = "Sun, 06 Nov 1994 08:49:37 GMT"
    try:
        repeated = await client.send(Request(f"{base}/?status=503&after=1&after=2", b"", capture_retry_after=True))
        dated = await client.send(Request(f"{base}/?status=429&after={quote(date)}", b"", capture_retry_after=True))
        absent = await client.send(Request(f"{base}/?status=503", b"", capture_retry_after=True))
        other = await client.send(Request(f"{base}/?status=500&after=9", b"", capture_retry_after=True))
        with_body = await client.send(Request(f"{base}/?status=503&after=5", b"", capture_retry_after=True,
                                              capture_body=True))
    finally:
        client.close()
    assert [r.retry_after for r in (repeated, dated, absent, other)] == ["2", date, None, None]
    assert (with_body.retry_after, with_body.body) == ("5", b"busy")
    assert all(r.headers is None and r.location is None for r in (repeated, dated, absent, other, with_body))


async def test_retry_after_alone_sets_no_header_callback_when_libcurl_keeps_the_headers(
        serve_app: ServerFactory) -> None:
    """The sinks ask every request for ``Retry-After``: with libcurl's header API no handle gets a
    capture (no header callback, no Python call per header line), and a 503's value still arrives."""
    if not curl_module.HEADER_API:
        pytest.skip("libcurl's header API is not available with this pycurl")

    async def handle(request: web.Request) -> web.Response:
        status = int(request.query["status"])
        return web.Response(status=status, headers={"Retry-After": "3"} if status == 503 else {})

    app = web.Application()
    app.router.add_post("/", handle)
    base = await serve_app(app)
    client = CurlClient(max_connections=2)
    try:
        answers = await asyncio.gather(*(client.send(Request(f"{base}/?status={status}", b"", capture_retry_after=True))
                                         for status in (200, 503, 200, 503)))
        captures = dict(client._captures)
    finally:
        client.close()
    assert [r.retry_after for r in answers] == [None, "3", None, "3"]
    assert captures == {}


async def test_one_handle_keeps_exactly_what_each_request_asks_for(serve_app: ServerFactory) -> None:
    """A handle's capture lists and callbacks are reused from request to request: each response has
    the body and headers of its own exchange, only what its request asked for, nothing of the last."""
    base = await serve_app(echo_app())
    client = CurlClient(max_connections=1)  # one easy handle for every request
    try:
        first = await client.send(Request(f"{base}/x", b"one", capture_body=True, capture_headers=True))
        bare = await client.send(Request(f"{base}/x", b"two"))
        headers_only = await client.send(Request(f"{base}/x", b"three", capture_headers=True))
        body_again = await client.send(Request(f"{base}/x", b"four", capture_body=True))
        both_again = await client.send(Request(f"{base}/x?status=201", b"five", capture_body=True,
                                               capture_headers=True))
    finally:
        client.close()
    assert (first.body, first.headers is not None) == (b"eno", True)
    assert (bare.body, bare.headers) == (None, None)
    assert headers_only.body is None
    assert headers_only.headers is not None
    assert headers_only.headers["content-length"] == "5"
    assert (body_again.body, body_again.headers) == (b"ruof", None)
    assert both_again.body == b"evif"
    assert both_again.headers is not None
    assert both_again.headers["content-length"] == "4"
    assert both_again.status == 201


async def test_prepared_posts_on_a_reused_handle_carry_their_own_url_body_and_headers(
        serve_app: ServerFactory) -> None:
    """A sink's prepared POSTs (nothing kept but ``Retry-After``) start on a handle set for them with
    only their body and header lines: around requests that captured on the same handle, or went to
    another URL or with another timeout, each still reaches its own URL with its own body and key,
    and keeps nothing but what it asked for."""
    seen: list[tuple[str, str, bytes]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("X-Key", ""), await request.read()))
        return web.Response(body=b"answer", status=int(request.query.get("status", "200")),
                            headers={"Retry-After": "7"})

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    base = await serve_app(app)

    def prepared(path: str, body: bytes, key: str, timeout: float = 10.0) -> Request:
        return Request(f"{base}{path}", body, post_header_lines((f"X-Key: {key}",)), timeout=timeout,
                       capture_retry_after=True, prepared=True, capture_local_port=False)

    client = CurlClient(max_connections=1)  # one easy handle for every request
    try:
        first = await client.send(prepared("/a", b"1", "k1"))
        second = await client.send(prepared("/a", b"2", "k2"))
        captured = await client.send(Request(f"{base}/a", b"3", capture_body=True))
        after_capture = await client.send(prepared("/a", b"4", "k4"))
        elsewhere = await client.send(prepared("/b?status=503", b"5", "k5"))
        shorter = await client.send(prepared("/b", b"6", "k6", timeout=5.0))
    finally:
        client.close()
    assert seen == [("/a", "k1", b"1"), ("/a", "k2", b"2"), ("/a", "", b"3"), ("/a", "k4", b"4"),
                    ("/b", "k5", b"5"), ("/b", "k6", b"6")]
    assert captured.body == b"answer"
    assert [r.body for r in (first, second, after_capture, elsewhere, shorter)] == [None] * 5
    assert [r.retry_after for r in (first, second, after_capture, elsewhere, shorter)] == [None, None, None, "7", None]
    assert [r.status for r in (first, second, after_capture, elsewhere, shorter)] == [200, 200, 200, 503, 200]


async def test_the_local_port_is_reported_unless_the_request_declines_it(serve_app: ServerFactory) -> None:
    base = await serve_app(echo_app())
    client = CurlClient(max_connections=1)
    try:
        asked = await client.send(Request(f"{base}/x", b"a"))
        declined = await client.send(Request(f"{base}/x", b"b", capture_local_port=False))
    finally:
        client.close()
    assert (asked.ok, declined.ok) == (True, True)
    assert asked.local_port > 0
    assert declined.local_port == 0


async def test_a_raising_completions_callback_is_reported_and_other_destinations_still_get_theirs(
        serve_app: ServerFactory) -> None:
    """A completion callback that raises goes to the loop's exception handler, and neither the driver
    nor another destination is stopped by it."""
    from egress.httpclient.curl import Completions

    base = await serve_app(echo_app())
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))
    received: list[str] = []
    arrived = asyncio.Event()

    def broken(batch: list[tuple[object, object]]) -> None:
        raise RuntimeError("broken destination")

    def working(batch: list[tuple[object, object]]) -> None:
        received.extend(str(token) for token, _ in batch)
        arrived.set()

    client = CurlClient(max_connections=4)
    try:
        client.submit_many([(Request(f"{base}/x", b"a"), "a")], Completions(loop, broken, lambda _: False))
        client.submit_many([(Request(f"{base}/x", b"b"), "b")], Completions(loop, working, lambda _: False))
        await asyncio.wait_for(arrived.wait(), timeout=10)
        assert (await asyncio.wait_for(client.send(Request(f"{base}/x", b"c")), timeout=10)).ok  # driver goes on
    finally:
        client.close()
        loop.set_exception_handler(None)
    assert received == ["b"]
    assert [str(error) for error in reported] == ["broken destination"]


async def test_requests_queued_before_a_raising_request_iterable_still_complete(serve_app: ServerFactory) -> None:
    """``submit_many`` takes any iterable: the requests it yielded before raising are queued with
    their destination, and the client goes on serving later ones."""
    from egress.httpclient.curl import Completions

    base = await serve_app(echo_app())
    loop = asyncio.get_running_loop()
    received: list[str] = []
    arrived = asyncio.Event()

    def callback(batch: list[tuple[object, object]]) -> None:
        received.extend(str(token) for token, _ in batch)
        arrived.set()

    def pairs() -> Iterator[tuple[Request, str]]:
        yield Request(f"{base}/x", b"a"), "a"
        raise ValueError("no more requests")

    client = CurlClient()
    try:
        with pytest.raises(ValueError, match="no more requests"):
            client.submit_many(pairs(), Completions(loop, callback, lambda _: False))
        assert (await asyncio.wait_for(client.send(Request(f"{base}/x", b"b")), timeout=10)).ok
        await asyncio.wait_for(arrived.wait(), timeout=10)
    finally:
        client.close()
    assert received == ["a"]


def forward_proxy_app(seen: list[str]) -> web.Application:
    """A forward proxy's front: records each request's target as sent (absolute-form through a
    proxy, origin-form to an origin) and answers 200 without going further."""
    async def handle(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.raw_path}")
        return web.Response(text="proxied")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def _proxy_environment(monkeypatch: pytest.MonkeyPatch, **variables: str) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
                 "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("variable", ["http_proxy", "all_proxy", "ALL_PROXY"])
async def test_an_http_url_goes_through_the_proxy_the_environment_names(
        serve_app: ServerFactory, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    seen: list[str] = []
    proxy = await serve_app(forward_proxy_app(seen))
    _proxy_environment(monkeypatch, **{variable: proxy})
    client = CurlClient(max_connections=2)  # reads the environment now
    try:
        # An origin that does not resolve: only the proxy can answer for it.
        responses = [await client.send(Request(f"http://origin.invalid:8080/events/{i}", b"x", capture_body=True))
                     for i in range(2)]
    finally:
        client.close()
    assert [(r.status, r.body) for r in responses] == [(200, b"proxied")] * 2
    assert seen == ["POST http://origin.invalid:8080/events/0", "POST http://origin.invalid:8080/events/1"]


async def test_no_proxy_hosts_bypass_the_proxy_and_upper_case_http_proxy_is_ignored(
        serve_app: ServerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    through_proxy: list[str] = []
    proxy = await serve_app(forward_proxy_app(through_proxy))
    at_origin: list[str] = []
    origin = await serve_app(forward_proxy_app(at_origin))
    _proxy_environment(monkeypatch, http_proxy=proxy, no_proxy="example.invalid, 127.0.0.1")
    bypassing = CurlClient(max_connections=1)
    _proxy_environment(monkeypatch, HTTP_PROXY=proxy)  # libcurl's rule: only http_proxy counts for http
    ignoring = CurlClient(max_connections=1)
    try:
        first = await bypassing.send(Request(f"{origin}/direct", b"x"))
        second = await ignoring.send(Request(f"{origin}/also-direct", b"x"))
    finally:
        bypassing.close()
        ignoring.close()
    assert (first.status, second.status) == (200, 200)
    assert at_origin == ["POST /direct", "POST /also-direct"]
    assert through_proxy == []


async def test_a_handle_moved_to_another_url_takes_that_urls_scheme_proxy_and_a_bad_url_fails_as_before(
        serve_app: ServerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    proxy = await serve_app(forward_proxy_app(seen))
    at_origin: list[str] = []
    origin = await serve_app(forward_proxy_app(at_origin))
    _proxy_environment(monkeypatch, http_proxy=proxy, no_proxy="127.0.0.1")
    client = CurlClient(max_connections=1)  # one handle for all three
    try:
        direct = await client.send(Request(f"{origin}/a", b"x"))
        bad = await client.send(Request("http://exa mple.invalid/", b"x"))
        proxied = await client.send(Request("http://origin.invalid/b", b"x"))
    finally:
        client.close()
    assert (direct.status, proxied.status) == (200, 200)
    assert bad.status == 0
    assert bad.curl_code == 3  # CURLE_URL_MALFORMAT, libcurl's own verdict
    assert at_origin == ["POST /a"]
    assert seen == ["POST http://origin.invalid/b"]


async def test_requests_name_egress_as_their_user_agent_unless_their_headers_give_one(
        serve_app: ServerFactory) -> None:
    agents: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        agents.append(request.headers.get("User-Agent", ""))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    base = await serve_app(app)
    client = CurlClient(max_connections=1)
    try:
        await client.send(Request(f"{base}/a", b"1"))
        await client.send(Request(f"{base}/a", b"2", headers=("User-Agent: mine/1",)))
    finally:
        client.close()
    assert agents == [curl_module.USER_AGENT, "mine/1"]
    assert curl_module.USER_AGENT.startswith("egress/")
