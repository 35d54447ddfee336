"""The tracing of one HTTP sink instance (tracing on only, ``egress.observe.tracing``): which of its
deliveries are sampled, the spans of first attempts sent on the batch path (no task, no delivery loop:
a sampled delivery costs a span, not a slower path), and what the delivery loop traces of the later
attempts (``delivery.TraceOf``). A request carries its message's context as ``traceparent``: the
attempt's span when sampled, else the context the message came with (``propagate_trace_context:
false``: none)."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from egress.connectors.base import SinkContext
from egress.httpclient import Request, Response
from egress.httpclient.outcomes import failure_of
from egress.keys import idempotency_key
from egress.observe import tracing as _tracing


class SinkTraces:
    """``context`` is the sink's; ``propagate`` its ``propagate_trace_context``."""

    __slots__ = ("_context", "_retried", "_spans", "propagate", "sampled")

    def __init__(self, context: SinkContext, *, propagate: bool) -> None:
        self._context = context
        self.propagate = propagate
        self.sampled: set[int] = set()  # seqs of deliveries sampled at their start, until they end
        self._spans: dict[int, Any] = {}  # seq → the span of its first attempt in flight (batch path)
        # seq → the context of a failed first attempt of a message that carried none: its later
        # attempts follow it in its trace
        self._retried: dict[int, str] = {}

    @property
    def pending(self) -> bool:
        """Whether a first attempt has a span in flight."""
        return bool(self._spans)

    def picker(self, sampling: _tracing.Sampling) -> Callable[[int], bool] | None:
        """What decides, at the start of a delivery ``seq`` on the batch path, whether its attempts are
        sampled (``None``: none is); one per batch of starts, so that a message without a carried
        context costs one random number."""
        if self._context.trace_contexts:
            return lambda seq: sampling.child(self.carried(seq))
        ratio = sampling.ratio
        if ratio <= 0.0:
            return None
        if ratio >= 1.0:
            return lambda seq: True
        draw = random.random

        def by_ratio(seq: int) -> bool:
            return draw() < ratio

        return by_ratio

    def traced(self) -> Collection[int] | None:
        """The seqs whose first attempt has something to trace (sampled, or carrying a context to send
        on); ``None`` when none has (tracing off included)."""
        if _tracing.active is None:
            return None
        contexts = self._context.trace_contexts
        if contexts and self.propagate:
            return self.sampled | contexts.keys() if self.sampled else contexts.keys()
        return self.sampled or None

    def carried(self, seq: int) -> str | None:
        """The trace context message ``seq`` carries from its source event (``None``: none)."""
        contexts = self._context.trace_contexts
        return contexts.get(seq) if contexts else None

    def attributes(self, seq: int, message_id: bytes, attempt: int) -> dict[str, Any]:
        context = self._context
        return {"egress.computation_id": context.computation_id, "egress.sink_id": context.sink_id,
                "egress.partition": context.partition, "egress.seq": seq,
                "egress.idempotency_key": idempotency_key(message_id), "egress.attempt": attempt,
                "egress.throttler_wait_seconds": 0.0}

    def first_attempt(self, seq: int, message_id: bytes, lines: tuple[str, ...],
                      extra: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """The header ``lines`` of delivery ``seq``'s first attempt with its trace context; a span
        ``delivery attempt`` starts now when the delivery is sampled (with the ``extra`` attributes)."""
        carried = self.carried(seq)
        tracing = _tracing.active
        if tracing is not None and seq in self.sampled:
            attributes = self.attributes(seq, message_id, 1)
            if extra:
                attributes.update(extra)
            span = self._spans[seq] = tracing.start("delivery attempt", self._context.clock.now(), parent=carried,
                                                    attributes=attributes)
            carried = _tracing.context_of_span(span, carried)
        if carried is None or not self.propagate:
            return lines
        return (*lines, *_tracing.headers_of_context(carried))

    def first_attempts_done(self, batch: Iterable[tuple[Any, Response]]) -> None:
        """First attempts of ``(delivery, response)`` ended (a delivery with ``seq`` and ``cancelled``:
        ``async_http``'s; a cancelled one's response is not its own)."""
        spans = self._spans
        for delivery, response in batch:
            if delivery.seq not in spans:
                continue
            if delivery.cancelled:  # the sink closed or blocked: its span ends without its response
                _tracing.end(spans.pop(delivery.seq), self._context.clock.now(), error="cancelled")
                self.sampled.discard(delivery.seq)
            else:
                self.first_attempt_done(delivery.seq, response,
                                        succeeded=response.error is None and 200 <= response.status <= 299)

    def first_attempt_done(self, seq: int, response: Response, *, succeeded: bool) -> None:
        """The first attempt of ``seq`` ended with ``response``: its span ends (an error unless it
        ``succeeded``); a delivery that succeeded is no longer sampled."""
        span = self._spans.pop(seq, None)
        if span is not None:
            failure = None if succeeded else failure_of(response)
            _tracing.end(span, self._context.clock.now(),
                         attributes={"http.response.status_code": response.status} if response.status else None,
                         error=None if failure is None else failure.message)
            if not succeeded and self.carried(seq) is None:
                self._retried[seq] = _tracing.context_of_span(span)
        if succeeded:
            self.sampled.discard(seq)

    def trace_of(self, seq: int, message_id: bytes) -> tuple[str | None, bool, dict[str, Any]]:
        """What the delivery loop traces of delivery ``seq``'s attempts: sampled when its first attempt
        was (it failed; without a carried context the later attempts are children of the first, in
        its trace), else decided now (a sink whose every attempt takes the loop)."""
        carried = self.carried(seq)
        if seq in self.sampled:
            self.sampled.discard(seq)
            sampled = True
            carried = self._retried.pop(seq, carried)
        else:
            tracing = _tracing.active
            sampled = tracing is not None and tracing.sampling.child(carried)
        attributes = self.attributes(seq, message_id, 0)
        del attributes["egress.attempt"], attributes["egress.throttler_wait_seconds"]  # the loop sets them
        return carried, sampled, attributes


class EndpointTraces(SinkTraces):
    """The tracing of a sink whose deliveries go to named endpoints (``webhook_http``): a delivery is an
    object with ``seq``, ``message_id`` and ``endpoint.name``, and every span of its attempts also
    carries ``egress.endpoint``. Its first attempts go as batches of ``(request, delivery)``."""

    __slots__ = ()

    def first_requests(self, requests: list[tuple[Request, Any]]) -> list[tuple[Request, Any]]:
        """Tracing on: decide which of the first attempts ``requests`` are sampled, start their spans,
        and add the trace context to the headers of those sampled or carrying one (in place). Tracing
        off, or nothing to trace: ``requests`` untouched, no call per request."""
        tracing = _tracing.active
        if tracing is None:
            return requests
        pick = self.picker(tracing.sampling)
        if pick is not None:
            for _, delivery in requests:
                if pick(delivery.seq):
                    self.sampled.add(delivery.seq)
        traced = self.traced()
        if traced is None:
            return requests
        for index, (request, delivery) in enumerate(requests):
            if delivery.seq in traced:
                lines = self.first_attempt(delivery.seq, delivery.message_id, request.headers,
                                           {"egress.endpoint": delivery.endpoint.name})
                requests[index] = (request._replace(headers=lines), delivery)
        return requests

    def ending(self, callback: Callable[[list[tuple[Any, Response]]], None]
               ) -> Callable[[list[tuple[Any, Response]]], None]:
        """``callback`` of a batch of first attempts' ``(delivery, response)``, ending the spans of those
        sampled first (only while a span is in flight: one test per batch otherwise)."""
        spans = self._spans

        def ended(batch: list[tuple[Any, Response]]) -> None:
            if spans:
                for delivery, response in batch:
                    if delivery.seq in spans:
                        self.first_attempt_done(delivery.seq, response,
                                                succeeded=response.error is None and 200 <= response.status <= 299)
            callback(batch)

        return ended

    def of_delivery(self, delivery: Any) -> tuple[str | None, bool, dict[str, Any]]:
        """:meth:`SinkTraces.trace_of` of ``delivery`` (``delivery.TraceOf``), with its endpoint."""
        carried, sampled, attributes = self.trace_of(delivery.seq, delivery.message_id)
        attributes["egress.endpoint"] = delivery.endpoint.name
        return carried, sampled, attributes
