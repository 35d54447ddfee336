"""Sensors of the distributed throttler, on a prometheus-client registry (the run's own).

Server (controller), read at scrape time: ``egress_throttler_value`` (units granted; its rate is
upstream's ``value.rate``), ``egress_throttler_queue_size``, ``egress_throttler_wait_time_seconds``
(oldest waiting request's age), per class (label ``quota_class``) ``granted``, ``refunded``,
``pending_requests``, ``pending_amount``, ``wait_time_seconds``, ``weight``, and
``classless_requests`` / ``unknown_class_requests``. Client (per computation and throttler):
``consumed``, ``released``, ``expired`` (prefetched units whose lease ended unused),
``wait_time_seconds`` (max), ``request_count``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from egress.throttler.controller import ThrottlerController

# prometheus-client is imported where a sensor is made or read, not with this module: a run that
# declares no throttler imports this module (its client's types) and never the library for it
# (egress.observe.metrics).


class ClientSensors:
    """The client-side sensors of every throttler handle in one process (labels: computation_id, throttler_id)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge

        labels = ["computation_id", "throttler_id"]
        self.consumed = Counter("egress_throttler_client_consumed", "Units used by throttle() calls.",
                                labels, registry=registry)
        self.released = Counter("egress_throttler_client_released", "Units given back with release().",
                                labels, registry=registry)
        self.expired = Counter("egress_throttler_client_expired",
                               "Units of prefetched quota whose lease ended before a call used them.",
                               labels, registry=registry)
        self.request_count = Counter("egress_throttler_client_request_count", "RequestQuota RPCs (retries included).",
                                     labels, registry=registry)
        self.wait_time = Gauge("egress_throttler_client_wait_time_seconds", "Longest wait of one throttle() call.",
                               labels, registry=registry)
        self.wait_total = Counter("egress_throttler_client_wait_seconds", "Total seconds spent waiting in throttle().",
                                  labels, registry=registry)
        self._max_wait: dict[tuple[str, str], float] = {}

    def observe(self, computation_id: str, throttler_id: str, amount: float, waited: float) -> None:
        self.consumed.labels(computation_id, throttler_id).inc(amount)
        if waited > 0:
            self.wait_total.labels(computation_id, throttler_id).inc(waited)
            key = (computation_id, throttler_id)
            if waited > self._max_wait.get(key, 0.0):
                self._max_wait[key] = waited
                self.wait_time.labels(computation_id, throttler_id).set(waited)


class ControllerCollector:
    """Reads the controller's queues at scrape time; register with ``registry.register(collector)``.

    ``controller`` is the controller, or a function returning the one this process serves now
    (``None``: none here, nothing is reported; a cluster worker serves one only while elected).
    """

    def __init__(self, controller: ThrottlerController | Callable[[], ThrottlerController | None]) -> None:
        self._controller = controller

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        controller = self._controller() if callable(self._controller) else self._controller
        if controller is None:
            return
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        now = controller.clock.monotonic()
        one = ["throttler_id"]
        two = ["throttler_id", "quota_class"]
        value = CounterMetricFamily("egress_throttler_value", "Units granted (net of refunds).", labels=one)
        queue_size = GaugeMetricFamily("egress_throttler_queue_size", "Requests waiting.", labels=["throttler_id"])
        wait = GaugeMetricFamily("egress_throttler_wait_time_seconds", "Age of the oldest waiting request.",
                                 labels=["throttler_id"])
        classless = CounterMetricFamily("egress_throttler_classless_requests",
                                        "Requests without a class on a throttler with classes.", labels=one)
        unknown = CounterMetricFamily("egress_throttler_unknown_class_requests",
                                      "Requests naming an unknown class (served as default).", labels=one)
        per_class = {name: GaugeMetricFamily(f"egress_throttler_class_{name}", help_, labels=two)
                     for name, help_ in (("pending_requests", "Requests waiting in the class."),
                                         ("pending_amount", "Units waiting in the class."),
                                         ("wait_time_seconds", "Age of the class's oldest waiting request."),
                                         ("weight", "Configured weight."))}
        granted = CounterMetricFamily("egress_throttler_class_granted", "Units granted to the class.",
                                      labels=["throttler_id", "quota_class"])
        refunded = CounterMetricFamily("egress_throttler_class_refunded", "Units refunded by cancelled requests.",
                                       labels=["throttler_id", "quota_class"])
        for throttler_id in controller.throttler_ids:
            queue = controller.queue(throttler_id)
            value.add_metric([throttler_id], max(0.0, queue.granted_total))
            queue_size.add_metric([throttler_id], queue.queue_size)
            pending = queue.pending()
            oldest = [o for _, _, o in pending.values() if o is not None]
            wait.add_metric([throttler_id], now - min(oldest) if oldest else 0.0)
            classless.add_metric([throttler_id], queue.classless_requests)
            unknown.add_metric([throttler_id], queue.unknown_class_requests)
            for class_id, (count, amount, first) in pending.items():
                per_class["pending_requests"].add_metric([throttler_id, class_id], count)
                per_class["pending_amount"].add_metric([throttler_id, class_id], amount)
                per_class["wait_time_seconds"].add_metric([throttler_id, class_id], now - first if first else 0.0)
            for class_id, (class_granted, class_refunded, weight) in queue.class_counters().items():
                granted.add_metric([throttler_id, class_id], max(0.0, class_granted))
                refunded.add_metric([throttler_id, class_id], class_refunded)
                per_class["weight"].add_metric([throttler_id, class_id], weight)
        yield from (value, queue_size, wait, classless, unknown, granted, refunded, *per_class.values())
