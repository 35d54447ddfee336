"""The delivery latency tracker of a partition job: commit → acknowledged, observed per epoch."""

from __future__ import annotations

from egress.engines import OutboxMessage, SinkProgress
from egress.observe import Metrics
from egress.runtime.delivery_latency import DeliveryLatency


def outbox(stream: str, *seqs: int) -> list[OutboxMessage]:
    return [OutboxMessage(seq, stream, bytes([seq]), b"", None, {"payload": "x"}) for seq in seqs]


def acked(seq: int) -> SinkProgress:
    return SinkProgress(max_persisted_seq_no=seq)


def test_an_epoch_counts_its_messages_once_its_last_one_is_acknowledged() -> None:
    metrics = Metrics()
    histogram = metrics.delivery_latency.bound("deliver")
    latency = DeliveryLatency({"http": "requests"}, {"http": histogram.labels("http")})
    latency.committed(outbox("requests", 1, 2, 3), now=10.0)
    latency.committed(outbox("requests", 4, 5), now=11.0)
    latency.acknowledged({"http": acked(2)}, now=12.0)  # the first epoch is not all acknowledged yet
    assert metrics.value("egress_sink_delivery_latency_seconds_count") == 0
    latency.acknowledged({"http": acked(5)}, now=13.5)
    assert metrics.value("egress_sink_delivery_latency_seconds_count") == 5
    assert metrics.value("egress_sink_delivery_latency_seconds_sum") == 3 * 3.5 + 2 * 2.5
    assert metrics.value("egress_sink_delivery_latency_seconds_bucket", le="2.5") == 2


def test_two_sinks_count_the_messages_of_their_own_stream() -> None:
    metrics = Metrics()
    histogram = metrics.delivery_latency.bound("deliver")
    latency = DeliveryLatency({"a": "to_a", "b": "to_b"}, {"a": histogram.labels("a"), "b": histogram.labels("b")})
    latency.committed([*outbox("to_a", 1, 3), *outbox("to_b", 2)], now=0.0)
    latency.acknowledged({"a": acked(3), "b": acked(0)}, now=1.0)
    assert metrics.value("egress_sink_delivery_latency_seconds_count", sink_id="a") == 2
    assert metrics.value("egress_sink_delivery_latency_seconds_count", sink_id="b") == 0
    latency.acknowledged({"a": acked(3), "b": acked(2)}, now=4.0)
    assert metrics.value("egress_sink_delivery_latency_seconds_sum", sink_id="b") == 4.0
