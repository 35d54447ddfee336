"""The NATS engine's outage handling without a server: which errors are tried again, a request
whose connection drops ends at once, and ``retrying`` gives up after ``outage_timeout``."""

from __future__ import annotations

import asyncio

import pytest
from nats import errors as client_errors
from nats.js.errors import APIError, KeyWrongLastSequenceError, NoStreamResponseError

from egress.engines.nats.errors import JetStreamRequestError, NatsUnavailableError
from egress.engines.nats.jetstream import JetStream, Link, is_transient


@pytest.mark.parametrize("error", [
    client_errors.TimeoutError(), client_errors.NoRespondersError(), client_errors.OutboundBufferLimitError(),
    client_errors.ConnectionReconnectingError(), client_errors.UnexpectedEOF(), TimeoutError(),
    ConnectionResetError(), NoStreamResponseError(), JetStreamRequestError(10008, "temporarily unavailable"),
    JetStreamRequestError(412, "direct get: status 412 Min Last Sequence"), APIError(code=503),
])
def test_errors_that_say_not_now_are_tried_again(error: BaseException) -> None:
    assert is_transient(error)


@pytest.mark.parametrize("error", [
    JetStreamRequestError(10071, "wrong last sequence"), JetStreamRequestError(10201, "duplicate message id"),
    client_errors.ConnectionClosedError(), client_errors.MaxPayloadError(), KeyWrongLastSequenceError(),
    ValueError("a bug"),
])
def test_refusals_and_other_errors_are_not(error: BaseException) -> None:
    assert not is_transient(error)


def stream(link: Link | None = None, outage_timeout: float = 5.0) -> JetStream:
    return JetStream(None, "KV_test", 1.0, "nats://127.0.0.1:1", outage_timeout=outage_timeout,  # type: ignore[arg-type]
                     link=link)


async def test_a_request_whose_connection_drops_is_tried_again_once_it_is_back() -> None:
    link = Link()
    attempts: list[bool] = []  # per attempt: was the connection up when it started
    first_sent = asyncio.Event()

    async def call() -> str:
        attempts.append(link.up.is_set())
        if len(attempts) == 1:
            first_sent.set()
            await asyncio.Event().wait()  # the answer that never comes: the connection dropped under it
        return "stored"

    async def drop_then_restore() -> None:
        await first_sent.wait()
        link.dropped()
        await asyncio.sleep(0)  # the request ends at once, then waits for the connection
        link.restored()

    restoring = asyncio.ensure_future(drop_then_restore())
    assert await stream(link).retrying("a batch", call) == "stored"
    await restoring
    assert attempts == [True, True]  # tried again, and only once the connection was back


async def test_retrying_gives_up_after_outage_timeout_with_nats_unavailable_error() -> None:
    async def call() -> None:
        raise client_errors.NoRespondersError

    with pytest.raises(NatsUnavailableError, match=r"the last message on x: no usable answer for 0.2 s"):
        await stream(outage_timeout=0.2).retrying("the last message on x", call)


async def test_retrying_lets_a_refusal_through_at_once() -> None:
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        raise JetStreamRequestError(10071, "wrong last sequence")

    with pytest.raises(JetStreamRequestError):
        await stream().retrying("a batch", call)
    assert calls == 1
