"""One delivery of the async HTTP sink on the virtual clock, with exact times.

The transport here is scripted: real sockets cannot run on virtual time, and these tests are about
the sink's decisions (when to retry, when to give up, what to follow). The same behaviours are
checked against real servers in tests/integration/connectors/sinks/test_async_http*.py.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from egress.clock import VirtualClock
from egress.connectors.base import SinkContext
from egress.connectors.sinks.async_http import AsyncHttpSink
from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
from egress.engines import OutboxMessage, SinkProgress
from egress.httpclient import Request, Response
from egress.observe import Metrics, StatusTree

STATUS = "/sinks/http/async_http_sink"


@dataclass
class Outcome:
    status: int = 200
    latency: float = 0.0
    error: str | None = None
    location: str | None = None
    retry_after: str | None = None


class ScriptedTransport:
    """Answers each request with ``script(request, sent_so_far)`` after its latency on the virtual clock;
    a latency beyond the request's timeout ends at the timeout with libcurl's timeout error."""

    def __init__(self, clock: VirtualClock, script: Callable[[Request, int], Outcome]) -> None:
        self.clock = clock
        self.script = script
        self.sent: list[tuple[float, Request]] = []

    def submit(self, request: Request) -> asyncio.Future[Response]:
        return asyncio.get_running_loop().create_task(self.send(request))

    async def send(self, request: Request) -> Response:
        self.sent.append((self.clock.now(), request))
        outcome = self.script(request, len(self.sent))
        if outcome.latency > request.timeout:
            await self.clock.sleep(request.timeout)
            return Response(0, "curl error 28: Operation timed out")
        await self.clock.sleep(outcome.latency)
        # As libcurl's client does: Retry-After only when asked for, and only of a 429 or 503.
        retry_after = outcome.retry_after if request.capture_retry_after and outcome.status in (429, 503) else None
        return Response(outcome.status, outcome.error, location=outcome.location if request.capture_location else None,
                        retry_after=retry_after)

    def close(self) -> None:
        pass

    def times(self, url: str | None = None, body: bytes | None = None) -> list[float]:
        return [t for t, r in self.sent if (url is None or r.url == url) and (body is None or r.body == body)]


class Harness:
    def __init__(self, script: Callable[[Request, int], Outcome], *, static: dict[str, Any] | None = None,
                 dynamic: dict[str, Any] | None = None, start: float = 0.0) -> None:
        self.clock = VirtualClock(start)
        self.metrics = Metrics()
        self.status = StatusTree()
        self.transport = ScriptedTransport(self.clock, script)
        context = SinkContext("deliver", "http", 0, self.clock, self.metrics, self.status, lambda _progress: None)
        self.sink = AsyncHttpSink(
            context,
            AsyncHttpSinkParameters.model_validate({"url": "http://receiver.test/events", "payload_column": "p",
                                                    **(static or {})}),
            AsyncHttpSinkDynamicParameters.model_validate({"retry_jitter_ratio": 0.0, **(dynamic or {})}),
            SinkProgress(),
            transport_factory=lambda scheme, parameters: self.transport,
        )

    def distribute(self, payloads: list[Any], first_seq: int = 1) -> None:
        self.sink.distribute([OutboxMessage(first_seq + i, "s", f"m{first_seq + i}".encode(), b"[]", None,
                                            {"p": p}) for i, p in enumerate(payloads)])

    def counter(self, name: str, **labels: str) -> float:
        return self.metrics.value(f"egress_sink_{name}_total", sink_id="http", **labels)


def always(status: int, **extra: Any) -> Callable[[Request, int], Outcome]:
    return lambda request, n: Outcome(status, **extra)


async def test_waits_for_promised_delay_before_next_attempt() -> None:
    """Three 503s then success: attempts at 0, 1, 3, 7 s (pauses 1, 2, 4 s with no jitter)."""
    h = Harness(lambda request, n: Outcome(503 if n <= 3 else 200))
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.transport.times() == [0.0, 1.0, 3.0, 7.0]
    assert h.sink.progress().max_persisted_seq_no == 1
    assert h.counter("retries") == 3
    assert h.counter("responses", status_code="503") == 3


async def test_fails_after_three_attempts_with_the_upstream_message() -> None:
    h = Harness(always(503), dynamic={"max_attempt_count": 3})
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.transport.times() == [0.0, 1.0, 3.0]
    assert h.sink.terminal_error == ("Async HTTP POST retry policy exhausted after 3 attempt(s); "
                                     "last error: HTTP status 503")
    assert h.sink.progress().max_persisted_seq_no == 0


async def test_a_delivery_is_terminal_at_the_instant_its_last_permitted_attempt_fails() -> None:
    """max_attempt_count 3, no jitter: attempts at exactly 0, d1 = 1 and d1 + d2 = 3 s, and the third
    failure is terminal at t = 3, not after one more backoff: /status shows the head's terminal error at
    once, it is the sink's terminal error, and later deliveries fail after it (a later one never becomes
    terminal on its own, and a message distributed then is never POSTed)."""
    h = Harness(lambda request, n: Outcome(503 if request.body == b"head" else 500), dynamic={"max_attempt_count": 3})
    h.distribute(["head", "later"])
    await h.clock.advance(3)
    assert h.transport.times(body=b"head") == [0.0, 1.0, 3.0]
    assert h.transport.times(body=b"later") == [0.0, 1.0, 3.0]
    terminal = "Async HTTP POST retry policy exhausted after 3 attempt(s); last error: HTTP status 503"
    assert h.sink.terminal_error == terminal
    assert h.status.error(STATUS) == terminal
    h.distribute(["after"], first_seq=3)
    await h.clock.advance(100)
    assert h.transport.times(body=b"after") == []
    assert len(h.transport.sent) == 6
    assert h.sink.terminal_error == terminal
    assert h.status._errors[STATUS][2] == "Async HTTP POST failed: HTTP status 500"  # failed with the head
    assert h.sink.progress().max_persisted_seq_no == 0


async def test_does_not_schedule_an_attempt_past_the_total_deadline() -> None:
    h = Harness(always(503), dynamic={"request_timeout": "2500ms", "attempt_timeout": "1s"})
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.transport.times() == [0.0, 1.0]  # the next pause (2 s) would end after 2.5 s
    assert (h.sink.terminal_error or "").startswith("Async HTTP POST retry deadline exhausted after 2 attempt(s)")


async def test_caps_each_attempt_by_the_remaining_deadline() -> None:
    h = Harness(lambda request, n: Outcome(200, latency=10.0),
                dynamic={"request_timeout": "5s", "attempt_timeout": "4s", "retry_initial_delay": "500ms"})
    h.distribute(["a"])
    await h.clock.advance(100)
    assert [(t, r.timeout) for t, r in h.transport.sent] == [(0.0, 4.0), (4.5, 0.5)]
    assert h.counter("attempt_failures") == 2
    assert (h.sink.terminal_error or "").startswith("Async HTTP POST retry")


async def test_reconfiguration_affects_a_delivery_already_retrying() -> None:
    """max_attempt_count 2 → 3 while the delivery pauses after its first failure: the second failure
    (at t = 1) is no longer its last, and the third attempt succeeds."""
    h = Harness(lambda request, n: Outcome(503 if n <= 2 else 200), dynamic={"max_attempt_count": 2})
    h.distribute(["a"])
    await h.clock.advance(0.5)  # first attempt failed; pausing until t = 1
    h.sink.reconfigure(AsyncHttpSinkDynamicParameters(max_attempt_count=3, retry_jitter_ratio=0.0))
    await h.clock.advance(10)
    assert h.transport.times() == [0.0, 1.0, 3.0]
    assert h.sink.terminal_error is None
    assert h.sink.progress().max_persisted_seq_no == 1


async def test_a_cap_lowered_during_a_pause_ends_the_delivery_when_the_pause_ends() -> None:
    h = Harness(always(503), dynamic={"max_attempt_count": 3})
    h.distribute(["a"])
    await h.clock.advance(0.5)  # first attempt failed; pausing until t = 1
    h.sink.reconfigure(AsyncHttpSinkDynamicParameters(max_attempt_count=1, retry_jitter_ratio=0.0))
    await h.clock.advance(0.5)
    assert h.transport.times() == [0.0]
    assert h.sink.terminal_error == ("Async HTTP POST retry policy exhausted after 1 attempt(s); "
                                     "last error: HTTP status 503")


@pytest.mark.parametrize("status", [200, 201, 204, 206, 299])
async def test_accepts_every_2xx(status: int) -> None:
    h = Harness(always(status))
    h.distribute(["a"])
    await h.clock.advance(1)
    assert h.sink.progress().max_persisted_seq_no == 1
    assert len(h.transport.sent) == 1


@pytest.mark.parametrize("status", [99, 199, 300, 404, 429, 500, 503, 599, 700])
async def test_retries_every_other_numeric_status(status: int) -> None:
    h = Harness(lambda request, n: Outcome(status if n == 1 else 200))
    h.distribute(["a"])
    await h.clock.advance(10)
    assert h.transport.times() == [0.0, 1.0]
    assert h.counter("responses", status_code=str(status)) == 1


async def test_retries_transport_and_timeout_failures() -> None:
    outcomes = [Outcome(0, error="curl error 7: refused"), Outcome(200, latency=20.0), Outcome(200)]
    h = Harness(lambda request, n: outcomes[n - 1])
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.transport.times() == [0.0, 1.0, 13.0]  # 1 s pause, a 10 s attempt timeout, then 2 s
    assert h.counter("attempt_failures") == 2
    assert h.sink.progress().max_persisted_seq_no == 1


async def test_a_response_read_failure_is_retried_and_counted_twice() -> None:
    h = Harness(lambda request, n: Outcome(200, error="curl error 18: transfer closed") if n == 1 else Outcome(200))
    h.distribute(["a"])
    await h.clock.advance(10)
    assert h.counter("responses", status_code="200") == 2
    assert h.counter("attempt_failures") == 1
    assert h.transport.times() == [0.0, 1.0]


async def test_status_shows_the_oldest_failing_delivery_and_clears_when_none_fails() -> None:
    def script(request: Request, n: int) -> Outcome:
        failing_until = {b"first": 3.0, b"second": 5.0}[request.body]
        return Outcome(503 if h.clock.now() < failing_until else 200)

    h = Harness(script)
    h.distribute(["first", "second"])
    await h.clock.advance(0.1)
    assert (h.status.error(STATUS) or "").endswith("HTTP status 503")
    assert h.status._errors[STATUS].keys() == {1, 2}
    await h.clock.advance(3.0)  # first succeeded at t = 3; second still failing
    assert set(h.status._errors[STATUS]) == {2}
    await h.clock.advance(10)
    assert h.status.error(STATUS) is None


async def test_a_terminal_error_stays_after_a_concurrent_success() -> None:
    h = Harness(lambda request, n: Outcome(500 if request.body == b"bad" else 200), dynamic={"max_attempt_count": 2})
    h.distribute(["bad", "good"])
    await h.clock.advance(10)
    assert (h.status.error(STATUS) or "").startswith("Async HTTP POST retry policy exhausted")
    assert h.sink.progress().max_persisted_seq_no == 0


async def test_terminal_head_failure_posts_no_later_message() -> None:
    h = Harness(lambda request, n: Outcome(500) if request.body == b"head" else Outcome(503),
                dynamic={"max_attempt_count": 2})
    h.distribute(["head", "later"])
    await h.clock.advance(1)  # attempts at 0 and 1: the second failure is terminal at once
    assert (h.sink.terminal_error or "").startswith("Async HTTP POST retry policy exhausted after 2")
    h.distribute(["after"], first_seq=3)
    await h.clock.advance(100)
    bodies = [r.body for _, r in h.transport.sent]
    assert bodies.count(b"head") == 2
    assert b"after" not in bodies
    assert bodies.count(b"later") <= 2
    assert h.sink.unacknowledged == 3


async def test_completes_4096_out_of_order_deliveries_as_a_contiguous_prefix() -> None:
    rng = random.Random(4096)
    latency = {f"p{i}".encode(): rng.uniform(0.0, 5.0) for i in range(4096)}
    latency[b"p0"] = 9.0  # the head finishes last
    # A pool of 1024 lets all 4096 be sent at once (the send window is 4 per pooled connection).
    h = Harness(lambda request, n: Outcome(200, latency=latency[request.body]), static={"max_idle_connections": 1024})
    h.distribute([f"p{i}" for i in range(4096)])
    await h.clock.advance(0)
    assert len(h.transport.sent) == 4096
    seen = []
    for _ in range(20):
        await h.clock.advance(0.5)
        seen.append(h.sink.progress().max_persisted_seq_no)
    assert seen[:17] == [0] * 17  # nothing before the head completes at t = 9
    assert seen[-1] == 4096
    assert h.counter("records_delivered") == 4096


async def test_max_in_flight_bounds_concurrent_deliveries() -> None:
    h = Harness(lambda request, n: Outcome(200, latency=1.0), static={"max_in_flight": 2})
    h.distribute(["a", "b", "c", "d", "e"])
    await h.clock.advance(10)
    assert h.transport.times() == [0.0, 0.0, 1.0, 1.0, 2.0]
    assert h.sink.progress().max_persisted_seq_no == 5


def redirecting(chain: dict[str, Outcome]) -> Callable[[Request, int], Outcome]:
    return lambda request, n: chain.get(request.url, Outcome(200))


async def test_stops_following_after_the_configured_number_of_redirects() -> None:
    h = Harness(redirecting({"http://receiver.test/events": Outcome(307, location="/one"),
                             "http://receiver.test/one": Outcome(308, location="/two"),
                             "http://receiver.test/two": Outcome(302, location="/three")}),
                static={"max_redirect_count": 2}, dynamic={"max_attempt_count": 2})
    h.distribute(["a"])
    await h.clock.advance(0.5)
    assert [r.url for _, r in h.transport.sent] == [
        "http://receiver.test/events", "http://receiver.test/one", "http://receiver.test/two"]
    assert h.counter("responses", status_code="302") == 1
    await h.clock.advance(10)
    # The redirect budget is per delivery, across attempts: the retry restarts at url and stops at the 3xx.
    assert [r.url for _, r in h.transport.sent][3:] == ["http://receiver.test/events"]
    assert (h.sink.terminal_error or "").endswith("HTTP status 307")


async def test_redirects_keep_method_body_and_headers() -> None:
    h = Harness(redirecting({"http://receiver.test/events": Outcome(301, location="//other.test/in?x=1")}),
                static={"max_redirect_count": 1, "headers": {"X-A": "b"}})
    h.distribute(["payload"])
    await h.clock.advance(1)
    first, second = (r for _, r in h.transport.sent)
    assert second.url == "http://other.test/in?x=1"
    assert (second.body, second.headers, second.method) == (first.body, first.headers, "POST")


async def test_refuses_https_to_http_without_sending_the_body() -> None:
    h = Harness(redirecting({"https://receiver.test/events": Outcome(302, location="http://receiver.test/plain")}),
                static={"url": "https://receiver.test/events", "max_redirect_count": 3},
                dynamic={"max_attempt_count": 1})
    h.distribute(["secret"])
    await h.clock.advance(10)
    assert [r.url for _, r in h.transport.sent] == ["https://receiver.test/events"]
    assert h.sink.terminal_error == ("Async HTTP POST retry policy exhausted after 1 attempt(s); "
                                     "last error: Async HTTP sink does not follow HTTPS to HTTP redirects")


async def test_an_unresolvable_location_fails_the_attempt() -> None:
    h = Harness(redirecting({"http://receiver.test/events": Outcome(302, location="ftp://files.test/x")}),
                static={"max_redirect_count": 3}, dynamic={"max_attempt_count": 1})
    h.distribute(["a"])
    await h.clock.advance(10)
    assert len(h.transport.sent) == 1
    assert "is not an http or https URL with a host" in (h.sink.terminal_error or "")


async def test_a_3xx_without_redirects_enabled_is_an_ordinary_retryable_status() -> None:
    h = Harness(lambda request, n: Outcome(302 if n == 1 else 200, location="/elsewhere"))
    h.distribute(["a"])
    await h.clock.advance(10)
    assert [r.url for _, r in h.transport.sent] == ["http://receiver.test/events"] * 2
    assert not any(r.capture_location for _, r in h.transport.sent)


async def test_a_non_string_payload_is_a_terminal_type_error() -> None:
    h = Harness(always(200))
    h.distribute([123, "later"])
    await h.clock.advance(1)
    assert h.sink.terminal_error == "Async HTTP payload column must contain a String or null value"
    assert h.transport.sent == []


async def test_a_seq_that_does_not_increase_is_an_error() -> None:
    h = Harness(always(200))
    h.distribute(["a", "b"])
    with pytest.raises(ValueError, match="not greater than the last distributed"):
        h.distribute(["c"], first_seq=2)


async def test_virtual_clock_runs_a_30_second_backoff_instantly() -> None:
    h = Harness(lambda request, n: Outcome(503 if n <= 6 else 200), dynamic={"max_attempt_count": 10,
                                                                            "request_timeout": "5m"})
    h.distribute(["a"])
    started = asyncio.get_running_loop().time()
    await h.clock.advance(200)
    assert h.transport.times() == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 61.0]
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_deliveries_beyond_the_send_window_wait_without_blocking_behind_failures() -> None:
    """At most 4 × pool deliveries are sending at once (memory stays bounded), but deliveries pausing
    between attempts leave the window, so fresh messages go out while failures back off."""
    h = Harness(lambda request, n: Outcome(503 if request.body.startswith(b"bad") else 200, latency=0.1),
                static={"max_idle_connections": 1}, dynamic={"max_attempt_count": 3})
    h.distribute(["bad-1", "bad-2", "bad-3", "bad-4"] + [f"good-{i}" for i in range(8)])
    await h.clock.advance(0)
    assert len(h.transport.sent) == 4  # window = 4 × 1 connection
    await h.clock.advance(0.5)  # the bad ones failed at 0.1 and pause for 1 s; the good ones go out meanwhile
    assert [(round(t, 3), r.body) for t, r in h.transport.sent[4:]] == [
        (0.1, f"good-{i}".encode()) for i in range(4)] + [(0.2, f"good-{i}".encode()) for i in range(4, 8)]
    await h.clock.advance(100)
    assert h.counter("records_delivered") == 8


async def test_a_throttled_sink_takes_one_unit_per_post_retries_included() -> None:
    """Beyond upstream: with throttler_id, every POST attempt waits for the global rate (2 per second here)."""
    from egress.spec import DynamicSpec
    from egress.throttler import Throttling

    h = Harness(lambda request, n: Outcome(503 if request.body == b"a" and n == 1 else 200))
    throttling = Throttling(DynamicSpec.model_validate({"throttlers": {"endpoint": {"limit": 2, "period": "1s"}}}),
                            h.clock)
    context = SinkContext("deliver", "http", 0, h.clock, h.metrics, h.status, lambda _progress: None, throttling)
    sink = AsyncHttpSink(
        context,
        AsyncHttpSinkParameters(url="http://receiver.test/events", payload_column="p", throttler_id="endpoint"),
        AsyncHttpSinkDynamicParameters(retry_jitter_ratio=0.0),
        SinkProgress(),
        transport_factory=lambda scheme, parameters: h.transport,
    )
    sink.distribute([OutboxMessage(i + 1, "s", f"m{i}".encode(), b"[]", None, {"p": p})
                     for i, p in enumerate(["a", "b", "c", "d", "e"])])
    async with h.clock.autojumping():
        while sink.progress().max_persisted_seq_no < 5:
            await h.clock.sleep(0.25)
    times = h.transport.times()
    assert len(times) == 6  # five messages and one retry, each a unit of the throttler
    for count, moment in enumerate(times, start=1):  # granted from the start: at most limit·t + limit·period
        assert count <= 2 * moment + 2
    assert times[-1] >= 2.0  # 6 units at 2/s with a burst of 2 need at least 2 s
    await sink.close()
    await throttling.aclose()


async def test_a_first_attempt_is_the_request_its_fields_say() -> None:
    """The first attempts' requests are built positionally (per message, without keywords): each
    field has the value the sink means, as the keyword form builds it."""
    h = Harness(always(200), static={"headers": {"X-Tenant": "t1"}})
    h.distribute(["a"])
    await h.clock.advance(1)
    (_, sent), = h.transport.sent
    dynamic = AsyncHttpSinkDynamicParameters.model_validate({})
    assert sent == Request("http://receiver.test/events", b"a",
                           ("Idempotency-Key: 6D31", "X-Tenant: t1", "Content-Type:", "Expect:"),
                           timeout=min(dynamic.attempt_timeout, dynamic.request_timeout),
                           capture_retry_after=dynamic.respect_retry_after, prepared=True,
                           capture_local_port=False)
