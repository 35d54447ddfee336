"""The retryable async request pipeline of YTsaurus Flow (upstream ``yt/yt/flow/examples/cpp/
retryable_async_request``), in egress.

Topology: ``event`` → StateKeeper → ``request`` → RequestProcessor (retries with timers) →
``response`` → StateKeeper (accumulates ``total_length`` per key in the external state ``/state``).

Differences from upstream, all deliberate:

- ``request_id`` is not ``RandomNumber<ui64>()`` but derived from the event's message id
  (``blake2b``, 63 bits so it fits ``int64``): a replayed batch after a crash must produce the same
  request, or exactly-once would break.
- ``Delay`` and ``MaxRetries`` are static ``processing_function_parameters`` whose defaults are
  upstream's constants (5 s, 3), so tests and the kill test can shorten the delay.
- :class:`HttpRequestProcessor` is the real variant: it POSTs the request to a service, retries
  transient failures with the same timers, and after ``max_attempts`` emits the request to the
  ``dead_letter`` stream instead of retrying forever (upstream has no cap).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from pydantic import BaseModel, Field

from egress import InitContext, Message, OutputCollector, ProcessFunction, RuntimeContext, Timer
from egress.httpclient import CurlClient, Request
from egress.runtime.state import ExternalStateClient, StateAccessor, StateClient
from egress.spec.durations import Duration


class RequestMessage(BaseModel):
    """Upstream ``TRequestMessage``."""

    request_id: int
    key: str
    request: str


class DelayedRequestState(BaseModel):
    """Upstream ``TDelayedRequestState``: the request being retried and its failed attempts."""

    failed_attempts: int = 0
    request: RequestMessage | None = None


def request_id_of(message_id: bytes) -> int:
    """A request id that is the same on every replay of the event: 63 bits of ``blake2b(message id)``."""
    return int.from_bytes(hashlib.blake2b(message_id, digest_size=8).digest(), "big") >> 1


class StateKeeper(ProcessFunction):
    """Upstream ``TStateKeeper``: ``event`` → a request; ``response`` → ``total_length += length``."""

    def init(self, ctx: InitContext) -> None:
        self.state: ExternalStateClient = ctx.external_state_client("/state", {"total_length": int})

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        if message.stream_id == "event":
            row = message.row
            output.add_message("request", {"request_id": request_id_of(message.message_id), "key": row["key"],
                                           "request": row["data"]})
        elif message.stream_id == "response":
            state = self.state.get(message.key)
            total_length = state.get_column("total_length") or 0
            state.set_column("total_length", total_length + message.row["length"])
        else:
            raise ValueError(f"Unexpected stream_id: {message.stream_id}")


class RequestProcessorParameters(BaseModel):
    """``delay``: between attempts (upstream ``Delay`` = 5 s); ``max_retries``: the period of the
    simulated success (upstream ``MaxRetries`` = 3)."""

    delay: Duration = 5.0
    max_retries: int = Field(default=3, ge=1)


class RequestProcessor(ProcessFunction):
    """Upstream ``TRequestProcessor``: keeps ``request_state`` per key and retries on timers."""

    parameters_model = RequestProcessorParameters

    def init(self, ctx: InitContext) -> None:
        self.request_state: StateClient[DelayedRequestState] = ctx.state_client("request_state",
                                                                               DelayedRequestState)

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        state = self.request_state.get(message.key)
        state.value.request = RequestMessage.model_validate(message.row)
        state.value.failed_attempts = 0
        await self.try_request(state, output, ctx)

    async def process_timer(self, timer: Timer, output: OutputCollector, ctx: RuntimeContext) -> None:
        state = self.request_state.get(timer.key)
        if state.exists:
            await self.try_request(state, output, ctx)

    def next_attempt(self, ctx: RuntimeContext) -> float:
        """Upstream ``GetNextAttempt``: now + delay."""
        parameters: RequestProcessorParameters = ctx.parameters
        return ctx.now() + parameters.delay

    async def attempt(self, request: RequestMessage, failed_attempts: int, ctx: RuntimeContext) -> str | None:
        """One attempt; ``None`` on success, else why it failed. Upstream ``IsRequestSuccessful``:
        ``(request_id + failed_attempts) % MaxRetries == 0``."""
        parameters: RequestProcessorParameters = ctx.parameters
        return None if (request.request_id + failed_attempts) % parameters.max_retries == 0 else "simulated failure"

    async def try_request(self, state: StateAccessor[DelayedRequestState], output: OutputCollector,
                          ctx: RuntimeContext) -> None:
        """Upstream ``TryRequest``: on failure count it and set a timer; on success emit the
        response and clear the state."""
        value = state.value
        assert value.request is not None
        error = await self.attempt(value.request, value.failed_attempts, ctx)
        if error is not None:
            value.failed_attempts += 1
            if not self.give_up(value, error, output):
                output.add_timer(self.next_attempt(ctx))
            else:
                state.clear()
            return
        request = value.request
        state.clear()
        output.add_message("response", {"request_id": request.request_id, "key": request.key,
                                        "length": len(request.request)})

    def give_up(self, value: DelayedRequestState, error: str, output: OutputCollector) -> bool:
        """Whether to stop retrying (upstream never does)."""
        return False


class HttpRequestProcessorParameters(RequestProcessorParameters):
    """``url``: where each attempt POSTs ``{"request_id", "key", "request"}`` (2xx = success);
    ``max_attempts``: attempts before the request goes to ``dead_letter``; ``timeout``: per attempt."""

    url: str
    max_attempts: int = Field(default=5, ge=1)
    timeout: Duration = 5.0


class HttpRequestProcessor(RequestProcessor):
    """The real variant: each attempt is an HTTP POST; after ``max_attempts`` failures the request
    and its last error go to the ``dead_letter`` stream and the state is cleared."""

    parameters_model = HttpRequestProcessorParameters

    def init(self, ctx: InitContext) -> None:
        super().init(ctx)
        self.parameters: HttpRequestProcessorParameters = ctx.parameters
        self.client: CurlClient | None = None

    async def attempt(self, request: RequestMessage, failed_attempts: int, ctx: RuntimeContext) -> str | None:
        if self.client is None:
            self.client = CurlClient(max_connections=4)
        body = orjson.dumps(request.model_dump())
        response = await self.client.send(Request(
            self.parameters.url, body, ("Content-Type: application/json",), timeout=self.parameters.timeout))
        if response.ok:
            return None
        return response.error or f"HTTP {response.status}"

    async def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def give_up(self, value: DelayedRequestState, error: str, output: OutputCollector) -> bool:
        if value.failed_attempts < self.parameters.max_attempts:
            return False
        request = value.request
        assert request is not None
        row: dict[str, Any] = {"request_id": request.request_id, "key": request.key, "request": request.request,
                               "attempts": value.failed_attempts, "error": error}
        output.add_message("dead_letter", row)
        return True


class DeadLetterRecorder(ProcessFunction):
    """Keeps each dead-lettered request in the external state ``/dead_letter`` (keyed by key and
    request id) with its text, attempts and last error, for ``egress state dump``."""

    def init(self, ctx: InitContext) -> None:
        self.table = ctx.external_state_client("/dead_letter", {"request": str, "attempts": int, "error": str})

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        row = self.table.get(message.key)
        for column in ("request", "attempts", "error"):
            row.set_column(column, message.row[column])
