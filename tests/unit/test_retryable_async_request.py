"""Upstream's unit tests of the retryable async request example, on egress.testing's virtual clock
(``yt/yt/flow/examples/cpp/retryable_async_request``: RequestProcessorRetriesUntilSuccess,
RequestProcessorSucceedsImmediately, StateKeeperAccumulatesResponseLengths,
StateKeeperEmitsRequestForEvent)."""

from __future__ import annotations

import pytest
from examples.retryable_async_request.functions import RequestProcessor, StateKeeper, request_id_of

from egress.errors import ProcessFunctionError
from egress.keys import source_message_id
from egress.testing import Emitted, ProcessFunctionHarness

KEY = ("user-1", 1)


def request(request_id: int, data: str = "hello") -> dict[str, object]:
    return {"request_id": request_id, "key": "user-1", "request": data}


async def test_request_processor_retries_until_success() -> None:
    harness = ProcessFunctionHarness(RequestProcessor, now=100, output_stream_ids=["response"])
    # request_id 1: (1 + 0) % 3 and (1 + 1) % 3 fail, (1 + 2) % 3 == 0 succeeds.
    assert await harness.process_message(request(1), key=KEY, stream_id="request") == []
    assert harness.timers() == [(KEY, 105.0)]
    assert harness.state("request_state", KEY).failed_attempts == 1
    assert await harness.process_timer(KEY, 105.0) == []
    assert harness.timers() == [(KEY, 105.0)]  # the clock still says 100, as in upstream's test
    assert harness.state("request_state", KEY).failed_attempts == 2
    outputs = await harness.process_timer(KEY, 105.0)
    assert outputs == [Emitted("response", {"request_id": 1, "key": "user-1", "length": 5}, ())]
    assert harness.timers() == []
    assert harness.state("request_state", KEY) is None


async def test_request_processor_retries_at_exact_virtual_times() -> None:
    harness = ProcessFunctionHarness(RequestProcessor, now=100, output_stream_ids=["response"])
    await harness.process_message(request(1, "abc"), key=KEY, stream_id="request")
    assert await harness.advance(4.999) == []
    assert harness.timers() == [(KEY, 105.0)]
    assert await harness.advance(0.001) == []  # fires at 105, fails again
    assert harness.timers() == [(KEY, 110.0)]
    outputs = await harness.advance(10)
    assert [o.row for o in outputs] == [{"request_id": 1, "key": "user-1", "length": 3}]
    assert harness.clock.now() == 115.0
    assert harness.timers() == []


async def test_request_processor_succeeds_immediately() -> None:
    harness = ProcessFunctionHarness(RequestProcessor, now=100, output_stream_ids=["response"])
    outputs = await harness.process_message(request(3, "payload"), key=KEY, stream_id="request")
    assert [o.row for o in outputs] == [{"request_id": 3, "key": "user-1", "length": 7}]
    assert harness.timers() == []
    assert harness.state("request_state", KEY) is None


async def test_delay_and_max_retries_are_validated_parameters() -> None:
    harness = ProcessFunctionHarness(RequestProcessor, now=0, parameters={"delay": "250ms", "max_retries": 2})
    await harness.process_message(request(1), key=KEY, stream_id="request")
    assert harness.timers() == [(KEY, 0.25)]
    with pytest.raises(Exception, match="processing_function_parameters/max_retries"):
        ProcessFunctionHarness(RequestProcessor, parameters={"max_retries": 0})


async def test_state_keeper_accumulates_response_lengths() -> None:
    harness = ProcessFunctionHarness(StateKeeper, output_stream_ids=["request"])
    for length in (3, 4, 10):
        assert await harness.process_message({"request_id": 7, "key": "k", "length": length}, key=("k",),
                                             stream_id="response") == []
    assert harness.external_state("/state", ("k",)) == {"total_length": 17}
    assert harness.external_state("/state", ("other",)) is None


async def test_state_keeper_emits_request_for_event() -> None:
    harness = ProcessFunctionHarness(StateKeeper, output_stream_ids=["request"])
    message_id = source_message_id("events", 0, 41)
    outputs = await harness.process_message({"key": "k", "data": "some data"}, key=("k",), stream_id="event",
                                            message_id=message_id)
    assert len(outputs) == 1
    assert outputs[0].stream_id == "request"
    assert outputs[0].row == {"request_id": request_id_of(message_id), "key": "k", "request": "some data"}
    assert 0 <= outputs[0].row["request_id"] < 2**63
    assert harness.external_state("/state", ("k",)) is None


async def test_state_keeper_rejects_an_unexpected_stream() -> None:
    harness = ProcessFunctionHarness(StateKeeper, output_stream_ids=["request"])
    with pytest.raises(ProcessFunctionError, match="Unexpected stream_id: click"):
        await harness.process_message({"x": 1}, key=("k",), stream_id="click")
