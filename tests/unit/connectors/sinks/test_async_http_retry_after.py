"""Retry-After in the async HTTP sink (beyond upstream) on the virtual clock, with exact times.

A 429 or 503 with ``Retry-After`` sets the next attempt's delay to at least that value (at most
``retry_after_maximum_delay``, default ``retry_maximum_delay``, and at most what is left of
``request_timeout``) and pauses every new attempt to its endpoint (scheme, host, port). The scripted
transport of ``test_http_sink_delivery`` hands the header over as libcurl's client does: only when the
request asks for it and only for a 429 or 503 (``tests/integration/httpclient/test_curl.py`` checks the
client itself).
"""

from __future__ import annotations

import datetime
import time
from email.utils import format_datetime

import pytest

from egress.httpclient import Request
from tests.unit.connectors.sinks.test_async_http_delivery import STATUS, Harness, Outcome, always

START = 1_800_000_000.0  # Fri, 15 Jan 2027 08:00:00 GMT: the wall time of the HTTP-date tests
URL = "http://receiver.test/events"
OTHER = "http://other.test:8080/in"


def once(first: Outcome, then: Outcome | None = None) -> Harness:
    """A harness whose first request gets ``first`` and every later one ``then`` (a 200)."""
    return Harness(lambda request, n: first if n == 1 else (then or Outcome(200)))


@pytest.mark.parametrize("status", [429, 503])
async def test_delay_seconds_set_the_next_attempts_delay(status: int) -> None:
    h = once(Outcome(status, retry_after="7"))
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.transport.times() == [0.0, 7.0]  # the backoff alone would have been 1 s
    assert h.counter("retry_after") == 1
    assert h.sink.progress().max_persisted_seq_no == 1


async def test_a_retry_after_shorter_than_the_backoff_leaves_the_backoff() -> None:
    h = once(Outcome(503, retry_after="0"))
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.transport.times() == [0.0, 1.0]
    assert h.counter("retry_after") == 1


@pytest.mark.parametrize("form", ["imf-fixdate", "rfc850", "asctime"])
async def test_an_http_date_counts_from_the_clocks_wall_time(form: str) -> None:
    moment = START + 9
    date = {
        "imf-fixdate": format_datetime(datetime.datetime.fromtimestamp(moment, datetime.UTC), usegmt=True),
        "rfc850": time.strftime("%A, %d-%b-%y %H:%M:%S GMT", time.gmtime(moment)),
        "asctime": time.asctime(time.gmtime(moment)),
    }[form]
    h = Harness(lambda request, n: Outcome(503, retry_after=date) if n == 1 else Outcome(200), start=START)
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.transport.times() == [START, START + 9]


@pytest.mark.parametrize("value", ["soon", "-5", "1.5", "", "120 s", "Sun, 31 Feb 2027 08:00:00 GMT"])
async def test_a_value_in_neither_form_is_ignored_and_counted(value: str) -> None:
    h = once(Outcome(503, retry_after=value))
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.transport.times() == [0.0, 1.0]
    assert h.counter("retry_after_invalid") == 1
    assert h.counter("retry_after") == 0


@pytest.mark.parametrize(("dynamic", "second"), [
    ({}, 30.0),                                                             # retry_maximum_delay
    ({"retry_after_maximum_delay": "5s"}, 5.0),
    ({"retry_maximum_delay": "2s", "retry_after_maximum_delay": "20s"}, 20.0),  # may exceed the backoff's cap
])
async def test_the_wait_is_capped_by_retry_after_maximum_delay(dynamic: dict[str, str], second: float) -> None:
    h = Harness(lambda request, n: Outcome(503, retry_after="3600") if n == 1 else Outcome(200), dynamic=dynamic)
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.transport.times() == [0.0, second]


async def test_a_retry_after_past_the_deadline_is_waited_out_and_terminal_at_the_deadline() -> None:
    h = Harness(always(503, retry_after="3600"),
                dynamic={"request_timeout": "10s", "attempt_timeout": "1s", "retry_after_maximum_delay": "1m"})
    h.distribute(["a"])
    await h.clock.advance(9.999)
    assert h.sink.terminal_error is None
    await h.clock.advance(0.001)
    assert h.sink.terminal_error == ("Async HTTP POST retry deadline exhausted after 1 attempt(s); "
                                     "last error: HTTP status 503")
    assert h.transport.times() == [0.0]


async def test_a_retry_waiting_for_its_endpoint_is_terminal_at_its_own_deadline() -> None:
    """The head fails with a 500 and would retry at t = 1, but the next delivery's 503 paused the
    endpoint for 20 s: the head waits until its deadline (5 s) and is terminal then, without a POST."""
    h = Harness(lambda request, n: Outcome(500) if request.body == b"head" else Outcome(503, retry_after="20"),
                dynamic={"request_timeout": "5s", "attempt_timeout": "1s"})
    h.distribute(["head", "next"])
    await h.clock.advance(4.999)
    assert h.sink.terminal_error is None
    await h.clock.advance(0.001)
    assert h.sink.terminal_error == ("Async HTTP POST retry deadline exhausted after 1 attempt(s); "
                                     "last error: HTTP status 500")
    assert h.transport.times() == [0.0, 0.0]


async def test_respect_retry_after_false_ignores_the_header() -> None:
    h = Harness(lambda request, n: Outcome(503, retry_after="7") if n == 1 else Outcome(200),
                dynamic={"respect_retry_after": False})
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.transport.times() == [0.0, 1.0]
    assert not any(r.capture_retry_after for _, r in h.transport.sent)
    assert h.counter("retry_after") == h.counter("retry_after_invalid") == 0


async def test_the_pause_is_endpoint_wide_for_retries_and_first_attempts() -> None:
    """Three deliveries fail at t = 0: "a" asks for 10 s, "b" for 5 s, "d" gets a 500 (backoff 1 s).
    The endpoint pauses until the latest end asked for, t = 10: no attempt to it starts before, the
    retries of b and d included, nor the first attempt of "c", distributed at t = 2."""
    answers = {b"a": Outcome(503, retry_after="10"), b"b": Outcome(503, retry_after="5"), b"d": Outcome(500)}
    h = Harness(lambda request, n: answers.pop(request.body, Outcome(200)))
    h.distribute(["a", "b", "d"])
    await h.clock.advance(2)
    h.distribute(["c"], first_seq=4)
    await h.clock.advance(100)
    assert {body: h.transport.times(body=body) for body in (b"a", b"b", b"c", b"d")} == {
        b"a": [0.0, 10.0], b"b": [0.0, 10.0], b"c": [10.0], b"d": [0.0, 10.0]}
    assert h.counter("retry_after") == 2
    assert h.sink.progress().max_persisted_seq_no == 4


async def test_a_first_attempt_held_by_a_pause_starts_its_request_timeout_when_it_starts() -> None:
    """request_timeout 5 s. "b" is distributed at t = 1 while the endpoint pauses until t = 4; it fails
    at 4 and 5 and succeeds at 7, which is within 5 s of its first attempt (not of its arrival)."""
    answers = {b"a": [Outcome(503, retry_after="4")], b"b": [Outcome(500), Outcome(500)]}
    h = Harness(lambda request, n: (answers[request.body] or [Outcome(200)]).pop(0),
                dynamic={"request_timeout": "5s", "attempt_timeout": "1s"})
    h.distribute(["a"])
    await h.clock.advance(1)
    h.distribute(["b"], first_seq=2)
    await h.clock.advance(100)
    assert h.transport.times(body=b"b") == [4.0, 5.0, 7.0]
    assert h.sink.terminal_error is None
    assert h.sink.progress().max_persisted_seq_no == 2


def redirected(targets: dict[bytes, str], paused_once: str, dynamic: dict[str, str] | None = None) -> Harness:
    """Every body is redirected from URL to its target; the first request to ``paused_once`` gets a
    503 asking for 10 s, every other request a 200."""
    asked: list[str] = []

    def script(request: Request, n: int) -> Outcome:
        if request.url == URL:
            return Outcome(307, location=targets[request.body]) if request.body in targets else Outcome(200)
        if request.url == paused_once and not asked:
            asked.append(request.url)
            return Outcome(503, retry_after="10")
        return Outcome(200)

    return Harness(script, static={"max_redirect_count": 2}, dynamic=dynamic)


async def test_other_endpoints_are_unaffected_and_redirects_wait_for_their_targets_pause() -> None:
    """"x" is redirected to other.test:8080, which asks for 10 s at t = 0. At t = 2, "y" is redirected
    there too and its POST to it waits until t = 10; "z" (no redirect, the configured endpoint) and
    "w" (redirected to another port of the same host) go through at once."""
    h = redirected({b"x": OTHER, b"y": OTHER, b"w": "http://other.test:9090/in"}, paused_once=OTHER)
    h.distribute(["x"])
    await h.clock.advance(2)
    h.distribute(["y", "z", "w"], first_seq=2)
    await h.clock.advance(100)
    assert h.transport.times(url=URL, body=b"z") == [2.0]
    assert h.transport.times(url="http://other.test:9090/in") == [2.0]
    assert h.transport.times(url=URL, body=b"y") == [2.0]
    assert h.transport.times(url=OTHER, body=b"y") == [10.0]
    assert h.transport.times(body=b"x") == [0.0, 0.0, 10.0, 10.0]  # x's own next attempt waits 10 s too
    assert h.sink.progress().max_persisted_seq_no == 4


async def test_a_redirect_whose_target_pauses_past_the_attempt_deadline_times_out_unsent() -> None:
    h = redirected({b"x": OTHER, b"y": OTHER}, paused_once=OTHER, dynamic={"attempt_timeout": "3s"})
    h.distribute(["x"])
    await h.clock.advance(2)
    h.distribute(["y"], first_seq=2)
    await h.clock.advance(3)  # y's attempt (t = 2 .. 5) ends at its deadline, waiting for other.test:8080
    assert h.transport.times(url=OTHER, body=b"y") == []
    assert h.status._errors[STATUS][2] == ("Async HTTP POST failed: attempt deadline reached while "
                                           "following redirects")
