"""The async HTTP sink (Flow's ``NYT::NFlow::TAsyncHttpSink``, alias ``async_http``).

Each committed message of the sink's input stream is POSTed with its payload column as the body,
byte for byte, and an idempotency header carrying the upper-case hex of its message id. POSTs run
concurrently; acknowledgements advance only as a contiguous prefix in ``seq`` order, and that
prefix is what the partition job commits as ``max_persisted_seq_no``. A delivery that exhausts
its retry budget is terminal for this sink instance: nothing after it is acknowledged or POSTed
until the sink is recreated (a restart). Rules: ``docs/http-sink.md``.
"""

from __future__ import annotations

import asyncio
import collections
from typing import ClassVar
from urllib.parse import urlsplit

from egress.connectors.base import SINKS, SinkContext
from egress.connectors.sinks.http_parameters import AsyncHttpSinkDynamicParameters, AsyncHttpSinkParameters
from egress.engines import OutboxMessage, SinkProgress
from egress.errors import DeliveryError, SpecError
from egress.httpclient import CurlClient, Request, backoff_seconds
from egress.keys import idempotency_key
from egress.spec import StreamSpec

STATUS_SUFFIX = "async_http_sink"
PAYLOAD_TYPE_ERROR = "Async HTTP payload column must contain a String or null value"
POLICY_EXHAUSTED = "Async HTTP POST retry policy exhausted"
DEADLINE_EXHAUSTED = "Async HTTP POST retry deadline exhausted"
# Concurrent transfers per client; upstream has no cap, see docs/architecture.md for why we do.
MAX_CONNECTIONS_PER_CLIENT = 64


class _Delivery:
    __slots__ = ("done", "message_id", "seq", "task")

    def __init__(self, seq: int, message_id: bytes) -> None:
        self.seq = seq
        self.message_id = message_id
        self.done = False
        self.task: asyncio.Task[None] | None = None


@SINKS.register("NYT::NFlow::TAsyncHttpSink", "async_http")
class AsyncHttpSink:
    """One instance per sink per partition job. See the module docs for the contract."""

    parameters_model: ClassVar[type[AsyncHttpSinkParameters]] = AsyncHttpSinkParameters
    dynamic_parameters_model: ClassVar[type[AsyncHttpSinkDynamicParameters]] = AsyncHttpSinkDynamicParameters

    @classmethod
    def check(cls, parameters: AsyncHttpSinkParameters, input_streams: dict[str, StreamSpec]) -> list[SpecError]:
        """Upstream construction checks: one input stream whose only column is the payload string."""
        if len(input_streams) != 1:
            return [SpecError(f"Async HTTP sink expects exactly one input stream, got {len(input_streams)}",
                              path="input_stream_ids")]
        (stream,) = input_streams.values()
        if len(stream.columns) != 1:
            return [SpecError(f"Async HTTP sink expects exactly one payload column, got {len(stream.columns)}",
                              path="parameters/payload_column")]
        column = stream.columns[0]
        if column.name != parameters.payload_column or column.type != "string":
            return [SpecError(
                f'Async HTTP sink payload column "{parameters.payload_column}" must be the only String column',
                path="parameters/payload_column")]
        return []

    @classmethod
    def create(
        cls,
        context: SinkContext,
        parameters: AsyncHttpSinkParameters,
        dynamic_parameters: AsyncHttpSinkDynamicParameters,
        progress: SinkProgress,
    ) -> AsyncHttpSink:
        return cls(context, parameters, dynamic_parameters, progress)

    def __init__(
        self,
        context: SinkContext,
        parameters: AsyncHttpSinkParameters,
        dynamic_parameters: AsyncHttpSinkDynamicParameters,
        progress: SinkProgress,
    ) -> None:
        self._context = context
        self._parameters = parameters
        self._dynamic = dynamic_parameters
        self._progress = progress
        self._last_distributed_seq = progress.max_persisted_seq_no
        self._pending: collections.deque[_Delivery] = collections.deque()
        self._terminal: tuple[int, str] | None = None
        self._clients: dict[str, CurlClient] = {}
        self._headers = tuple(f"{name}: {value}" for name, value in parameters.headers.items())
        self._status_path = f"/sinks/{context.sink_id}/{STATUS_SUFFIX}"
        sink_id = context.sink_id
        metrics = context.metrics
        self._requests = metrics.http_sink_requests.labels(sink_id)
        self._retries = metrics.http_sink_retries.labels(sink_id)
        self._attempt_failures = metrics.http_sink_attempt_failures.labels(sink_id)
        self._delivered = metrics.http_sink_delivered.labels(sink_id)
        self._responses = metrics.http_sink_responses

    # -- the Sink protocol -------------------------------------------------------------------

    def distribute(self, messages: list[OutboxMessage]) -> None:
        column = self._parameters.payload_column
        for message in messages:
            if message.seq <= self._progress.max_persisted_seq_no:
                continue  # persisted before a restart: acknowledged without a POST
            if message.seq <= self._last_distributed_seq:
                raise ValueError(
                    f"message seq {message.seq} is not greater than the last distributed {self._last_distributed_seq}"
                )
            self._last_distributed_seq = message.seq
            delivery = _Delivery(message.seq, message.message_id)
            self._pending.append(delivery)
            payload = message.row.get(column)
            if payload is None:
                delivery.done = True  # null: acknowledged in order, no request, no metric
                continue
            if not isinstance(payload, str | bytes):
                self._fail(delivery, PAYLOAD_TYPE_ERROR)
                continue
            if self._terminal is not None:
                continue  # nothing later than a terminal failure is POSTed by this instance
            body = payload.encode() if isinstance(payload, str) else payload
            delivery.task = asyncio.get_running_loop().create_task(self._deliver(delivery, body))
        if self._pending and self._pending[0].done:
            self._context.on_progress()

    def progress(self) -> SinkProgress:
        pending = self._pending
        last: _Delivery | None = None
        while pending and pending[0].done:
            last = pending.popleft()
        if last is not None:
            self._progress = SinkProgress(self._progress.producer_id, last.message_id, last.seq)
        return self._progress

    @property
    def unacknowledged(self) -> int:
        return len(self._pending)

    @property
    def terminal_error(self) -> str | None:
        return self._terminal[1] if self._terminal else None

    def reconfigure(self, dynamic_parameters: AsyncHttpSinkDynamicParameters) -> None:
        self._dynamic = dynamic_parameters

    async def close(self) -> None:
        tasks = [d.task for d in self._pending if d.task is not None and not d.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    # -- one delivery ------------------------------------------------------------------------

    def _client(self, url: str) -> CurlClient:
        scheme = urlsplit(url).scheme
        client = self._clients.get(scheme)
        if client is None:
            client = CurlClient(
                max_connections=MAX_CONNECTIONS_PER_CLIENT,
                max_idle_connections=self._parameters.max_idle_connections,
                keep_alive=self._parameters.keep_alive,
            )
            self._clients[scheme] = client
        return client

    async def _deliver(self, delivery: _Delivery, body: bytes) -> None:
        """Attempts until a 2xx or the budget ends (upstream ``TAsyncHttpSink`` delivery loop)."""
        clock = self._context.clock
        url = self._parameters.url
        headers = self._headers
        if self._parameters.idempotency_header:
            headers = (*headers, f"{self._parameters.idempotency_header}: {idempotency_key(delivery.message_id)}")
        start = clock.monotonic()
        attempts = 0
        last_error: str | None = None
        while True:
            dynamic = self._dynamic  # read at every decision: DynamicSpec changes apply live
            remaining = start + dynamic.request_timeout - clock.monotonic()
            if attempts >= dynamic.max_attempt_count or remaining <= 0:
                self._fail(delivery, str(DeliveryError(POLICY_EXHAUSTED, attempts=attempts, last_error=last_error)))
                return
            attempts += 1
            self._requests.inc()
            if attempts > 1:
                self._retries.inc()
            response = await self._client(url).send(
                Request(url, body, headers, timeout=min(dynamic.attempt_timeout, remaining))
            )
            if response.status:
                self._responses.labels(self._context.sink_id, str(response.status)).inc()
            if response.error is not None:
                self._attempt_failures.inc()
            if response.ok:
                self._succeed(delivery)
                return
            last_error = response.error or f"HTTP status {response.status}"
            self._context.status.set_error(self._status_path, delivery.seq, f"Async HTTP POST failed: {last_error}")
            dynamic = self._dynamic
            delay = backoff_seconds(dynamic.backoff_policy(), attempts - 1)
            if delay >= start + dynamic.request_timeout - clock.monotonic():
                self._fail(delivery, str(DeliveryError(DEADLINE_EXHAUSTED, attempts=attempts, last_error=last_error)))
                return
            await clock.sleep(delay)
            if self._terminal is not None and self._terminal[0] < delivery.seq:
                return  # an earlier delivery failed for good: no later message is POSTed

    def _succeed(self, delivery: _Delivery) -> None:
        delivery.done = True
        self._delivered.inc()
        self._context.status.clear_error(self._status_path, delivery.seq)
        self._context.on_progress()

    def _fail(self, delivery: _Delivery, error: str) -> None:
        self._context.status.set_error(self._status_path, delivery.seq, error)
        if self._terminal is None or delivery.seq < self._terminal[0]:
            self._terminal = (delivery.seq, error)
        for later in self._pending:
            if later.seq > delivery.seq and later.task is not None and not later.task.done():
                later.task.cancel()
        self._context.on_progress()


__all__ = ["AsyncHttpSink", "AsyncHttpSinkDynamicParameters", "AsyncHttpSinkParameters"]
