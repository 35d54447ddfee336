"""Hostile requests to the ``egress receiver``, the Firehose receiver and the throttler service,
fuzzed with hypothesis over real loopback sockets: random methods, paths, headers, bodies and
framings, near-valid ``RequestQuota`` bodies, and slowloris-style partial requests.

Each server answers within a time limit with a status below 500 (the throttler's 503 only with its
deliberate ``unavailable`` code), refuses a body over its limit with 413 instead of buffering it
(bounded memory), and keeps serving others while partial requests hold connections open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from hypothesis import example, given
from hypothesis import strategies as st

from egress.clock import RealClock
from egress.firehose import FirehoseReceiver, ReceiverOptions
from egress.receiver import Receiver, ReceiverConfig
from egress.spec import DynamicSpec
from egress.throttler.controller import ThrottlerController
from egress.throttler.models import validate_dynamic_throttlers
from egress.throttler.service import REQUEST_QUOTA_PATH, make_app
from tests.fuzzing import fuzz

pytestmark = pytest.mark.integration

ANSWER_TIMEOUT = 10.0
SLOW_CONNECTIONS = 20
FIREHOSE_KEY = "fuzz-key"


@dataclass
class Servers:
    """The three servers on loopback, served by one event loop in a thread: ``port`` by name."""

    ports: dict[str, int]
    controller: ThrottlerController


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()
    found: dict[str, Any] = {}

    async def main() -> None:
        throttlers = validate_dynamic_throttlers(DynamicSpec.model_validate(
            {"throttlers": {"q": {}}}))  # unlimited: any valid amount is granted at once, a wait is a bug
        controller = ThrottlerController(throttlers, RealClock())
        firehose = FirehoseReceiver(lambda request_id, records, attributes: asyncio.sleep(0),
                                    ReceiverOptions(access_keys=frozenset({FIREHOSE_KEY})))
        apps = {"receiver": (Receiver(ReceiverConfig()).app, {}),
                "throttler": (make_app(controller), {"handler_cancellation": True}),
                "firehose": (firehose.app, {"auto_decompress": False})}
        runners = []
        for name, (app, options) in apps.items():
            runner = web.AppRunner(app, access_log=None, **options)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            found[name] = runner.addresses[0][1]
            runners.append(runner)
        found["controller"] = controller
        ready.set()
        await stop.wait()
        for runner in runners:
            await runner.cleanup()
        await controller.aclose()
        left = asyncio.all_tasks() - {asyncio.current_task()}  # handlers of connections the tests left half-sent
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30), "the servers did not start"
    controller = found.pop("controller")
    try:
        yield Servers(found, controller)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


def exchange(port: int, data: bytes, timeout: float = ANSWER_TIMEOUT, *, complete: bool = True) -> bytes:
    """Send ``data`` and read the answer until the server closes (every request says ``Connection:
    close``). A ``complete`` request must be answered within ``timeout``; an incomplete one (the
    server rightly waits for the rest) may get no answer by then. (No half-close: aiohttp drops a
    request whose connection reached EOF before the answer.)"""
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # refused before all was sent
            connection.sendall(data)
        while True:
            try:
                chunk = connection.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                break
            except TimeoutError:
                assert not complete, f"no answer within {timeout} s to {data[:300]!r}"
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(answer: bytes) -> int | None:
    """The status of the first response in ``answer`` (``None``: the server closed without one)."""
    if not answer:
        return None
    line = answer.split(b"\r\n", 1)[0].split()
    assert len(line) >= 2, answer[:200]
    assert line[0].startswith(b"HTTP/1."), answer[:200]
    return int(line[1])


def request(method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    return head.encode("latin-1", "replace") + b"\r\n" + body


TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "CONNECT", "BREW"]) \
    | st.text(TOKEN, min_size=1, max_size=8)
paths = st.sampled_from(["/", "/events", "/stats", REQUEST_QUOTA_PATH, "/metrics", "/healthz", "/%zz", "//x/../..",
                         "/?a=%00", "*", "http://other/x"]) \
    | st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=30).map(lambda t: "/" + t)
header_values = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=40)
headers = st.lists(st.tuples(st.sampled_from(["Content-Type", "Content-Encoding", "Idempotency-Key", "Expect",
                                             "Transfer-Encoding", "X-Amz-Firehose-Access-Key", "Accept-Encoding",
                                             "X-Amz-Firehose-Request-Id", "Cookie", "Range"])
                             | st.text(TOKEN, min_size=1, max_size=12), header_values), max_size=5)
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**64, 2**64)
                           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
                           lambda children: st.lists(children, max_size=3)
                           | st.dictionaries(st.text(max_size=6), children, max_size=3), max_leaves=8)
quota_calls = st.fixed_dictionaries({}, optional={
    "throttler_id": st.sampled_from(["q", "nope", ""]) | json_values, "client_id": json_values,
    "amount": st.sampled_from([0, 1, 2.5, -1, 1e300, 10**30, "1", "nan", "inf", "-inf", None]) | json_values,
    "timestamp": st.sampled_from([0, -1e300, 1e300, "nan", "x"]) | json_values,
    "quota_class_id": json_values, "hold": st.sampled_from([0, 1, -5, 1e300, "inf", "nan"]) | json_values,
})
bodies = st.binary(max_size=512) | json_values.map(lambda v: json.dumps(v).encode()) \
    | quota_calls.map(lambda v: json.dumps(v).encode())


def check_answer(server: str, answer: bytes) -> None:
    status = status_of(answer)
    if status is None or status < 500:
        return
    body = answer.split(b"\r\n\r\n", 1)[-1]
    deliberate = server == "throttler" and status == 503 and b'"unavailable"' in body
    assert deliberate, answer[:500]


@fuzz(200)
@given(server=st.sampled_from(["receiver", "throttler", "firehose"]), method=methods, path=paths, headers=headers,
       body=bodies, length=st.sampled_from(["exact", "none", "chunked", "short", "raw"]))
@example(server="throttler", method="POST", path=REQUEST_QUOTA_PATH, headers=[],
         body=b'{"throttler_id": "q", "amount": "nan"}', length="exact")
@example(server="throttler", method="POST", path=REQUEST_QUOTA_PATH, headers=[],
         body=b'{"throttler_id": "q", "amount": 1e300}', length="exact")
@example(server="throttler", method="POST", path=REQUEST_QUOTA_PATH, headers=[],
         body=b'{"throttler_id": "q", "amount": 1, "hold": "inf"}', length="exact")
@example(server="receiver", method="POST", path="/events", headers=[("Content-Encoding", "gzip")], body=b"not gzip",
         length="exact")  # was a 500: aiohttp's decoding error escaped the handler
@example(server="receiver", method="GET", path="/", headers=[("Expect", "\x80")], body=b"", length="exact")  # was 500
@example(server="throttler", method="GET", path=REQUEST_QUOTA_PATH, headers=[("Expect", "\xe9")], body=b"",
         length="exact")  # no route for GET: answered by the catch-all
@example(server="firehose", method="POST", path="/", headers=[("Expect", "\xff")], body=b"x", length="exact")
@example(server="throttler", method="POST", path=REQUEST_QUOTA_PATH, headers=[("Content-Encoding", "deflate")],
         body=b'{"throttler_id": "q", "amount": 1}', length="exact")
@example(server="receiver", method="POST", path="/events", headers=[("Transfer-Encoding", "chunked")],
         body=b"zz\r\nxx\r\n", length="raw")
def test_a_hostile_request_is_answered_in_time_without_a_5xx(
        servers: Servers, server: str, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
        length: str) -> None:
    framed = [(n, v) for n, v in headers if n.lower() not in ("content-length", "transfer-encoding", "connection")]
    if length == "exact":
        framed.append(("Content-Length", str(len(body))))
    elif length == "short":  # a Content-Length below the body: the rest is a second, garbage request
        framed.append(("Content-Length", str(len(body) // 2)))
    elif length == "chunked":
        framed.append(("Transfer-Encoding", "chunked"))
        body = (f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n") if body else b"0\r\n\r\n"
    elif length == "raw":  # the headers' own framing, whatever it says: may leave the request incomplete
        framed = headers
    complete = length != "raw" and method not in ("CONNECT",)
    answer = exchange(servers.ports[server], request(method, path, framed, body), 2.0 if not complete else
                      ANSWER_TIMEOUT, complete=complete)
    if complete:
        assert status_of(answer) is not None, f"closed without an answer to {method} {path}"
    check_answer(server, answer)


@pytest.mark.parametrize("framing", ["Content-Length", "chunked"])
def test_a_quota_request_over_the_body_limit_is_refused_with_413(servers: Servers, framing: str) -> None:
    """The throttler service reads at most its 1 MiB limit of a body, then refuses it (bounded memory)."""
    body = b'{"throttler_id": "q", "amount": 1, "client_id": "' + b"x" * (1024 * 1024) + b'"}'
    if framing == "chunked":
        head = [("Transfer-Encoding", "chunked")]
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    else:
        head = [("Content-Length", str(len(body)))]
    assert status_of(exchange(servers.ports["throttler"], request("POST", REQUEST_QUOTA_PATH, head, body))) == 413


@pytest.mark.parametrize("server", ["receiver", "throttler", "firehose"])
@pytest.mark.parametrize("partial", ["headers", "body"])
def test_partial_requests_holding_connections_do_not_stop_others_being_served(
        servers: Servers, server: str, partial: str) -> None:
    """Slowloris: connections with half-sent headers, or a body shorter than its Content-Length, stay
    open while a complete request on another connection is still answered within the time limit."""
    port = servers.ports[server]
    stalled = []
    try:
        for _ in range(SLOW_CONNECTIONS):
            connection = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT)
            if partial == "headers":
                connection.sendall(b"POST /events HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            else:
                connection.sendall(b"POST " + REQUEST_QUOTA_PATH.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   b"Content-Length: 1000\r\n\r\n{\"throttler_id\": ")
            stalled.append(connection)
        path = {"receiver": "/stats", "throttler": "/healthz", "firehose": "/"}[server]
        answer = exchange(port, request("GET", path, [], b""))
        status = status_of(answer)
        assert status is not None, answer[:300]
        assert status < 500, answer[:300]
    finally:
        for connection in stalled:
            connection.close()
