"""Token bucket and the per-throttler quota queue: mirrors upstream's bucket tests, exact times."""

from __future__ import annotations

from typing import Any

import pytest

from egress.throttler.bucket import TokenBucket
from egress.throttler.errors import QuotaAmountError
from egress.throttler.models import ThrottlerSpec
from egress.throttler.queue import QuotaQueue, QuotaRequest


def spec(**fields: Any) -> ThrottlerSpec:
    return ThrottlerSpec.model_validate(fields)


def run_until(queue: QuotaQueue, start: float, end: float) -> list[tuple[float, QuotaRequest]]:
    """Drive the queue as the controller does (jump to each ready time); returns (time, resolved)."""
    now, resolved = start, []
    while now <= end:
        resolved.extend((now, r) for r in queue.poll(now))
        ready = queue.next_ready(now)
        if ready is None:
            break
        now = max(ready, now)
    return resolved


def test_token_bucket_starts_full_refills_and_caps() -> None:
    bucket = TokenBucket(10.0, 2.0, now=0.0)
    assert bucket.capacity == 20.0
    assert bucket.tokens(0.0) == 20.0
    bucket.take(20.0, 0.0)
    assert bucket.ready_at(5.0, 0.0) == 0.5
    assert bucket.tokens(1.0) == 10.0
    assert bucket.tokens(100.0) == 20.0
    with pytest.raises(ValueError, match="cannot take"):
        bucket.take(21.0, 100.0)


def test_unlimited_bucket_never_waits() -> None:
    bucket = TokenBucket(None, 10.0, now=0.0)
    bucket.take(1e12, 0.0)
    assert bucket.ready_at(1e12, 0.0) == 0.0


def test_priority_ordering() -> None:
    queue = QuotaQueue(spec(limit=1.0, period="1s"), now=0.0)
    queue.bucket.take(1.0, 0.0)  # empty: everything waits
    requests = {ts: queue.submit(1, 0.0, timestamp=ts) for ts in (300.0, 100.0, 200.0)}
    resolved = run_until(queue, 0.0, 10.0)
    assert [(t, r.timestamp) for t, r in resolved] == [(1.0, 100.0), (2.0, 200.0), (3.0, 300.0)]
    assert all(r.done for r in requests.values())


def test_equal_timestamps_go_in_enqueue_order_never_by_size() -> None:
    queue = QuotaQueue(spec(limit=10.0, period="1s"), now=0.0)
    queue.bucket.take(10.0, 0.0)
    big = queue.submit(10, 0.0, timestamp=5.0)
    small = queue.submit(1, 0.0, timestamp=5.0)
    resolved = run_until(queue, 0.0, 10.0)
    assert [r for _, r in resolved] == [big, small]
    assert [t for t, _ in resolved] == [1.0, 1.1]


def test_cancelled_request() -> None:
    queue = QuotaQueue(spec(limit=1.0, period="1s"), now=0.0)
    queue.bucket.take(1.0, 0.0)
    first = queue.submit(5, 0.0, timestamp=1.0)
    second = queue.submit(1, 0.0, timestamp=2.0)
    assert queue.poll(0.0) == []
    queue.cancel(first, 0.5)
    assert run_until(queue, 0.5, 5.0) == [(1.0, second)]
    assert first.cancelled
    assert not first.done
    queue.cancel(first, 2.0)  # twice: no-op
    queue.cancel(second, 2.0)  # done: no-op
    assert queue.bucket.tokens(2.0) == 1.0


def test_reconfigure_to_unlimited() -> None:
    queue = QuotaQueue(spec(limit=1.0, period="1s"), now=0.0)
    queue.bucket.take(1.0, 0.0)
    waiting = [queue.submit(100, 0.0, timestamp=float(i)) for i in range(3)]
    assert queue.poll(0.0) == []
    queue.reconfigure(spec(), now=0.25)
    assert queue.poll(0.25) == waiting
    assert queue.next_ready(0.25) is None


def test_zero_amount_is_done_at_once_and_negative_is_rejected() -> None:
    queue = QuotaQueue(spec(limit=1.0), now=0.0)
    assert queue.submit(0, 0.0).done
    with pytest.raises(QuotaAmountError, match="Quota amount must be non-negative, got -3"):
        queue.submit(-3, 0.0)


def test_unknown_and_empty_class_use_default() -> None:
    queue = QuotaQueue(spec(limit=10.0, classes={"vip": {"weight": 5.0}}), now=0.0)
    assert queue.submit(1, 0.0, class_id=None).class_id == "default"
    assert queue.submit(1, 0.0, class_id="").class_id == "default"
    assert queue.submit(1, 0.0, class_id="nope").class_id == "default"
    assert queue.submit(1, 0.0, class_id="vip").class_id == "vip"
    assert (queue.classless_requests, queue.unknown_class_requests) == (2, 1)
    plain = QuotaQueue(spec(limit=10.0), now=0.0)
    plain.submit(1, 0.0, class_id="anything")
    assert (plain.classless_requests, plain.unknown_class_requests) == (0, 0)


def test_chunking_interleaves_classes() -> None:
    chunks: list[tuple[str, float, float]] = []
    queue = QuotaQueue(spec(limit=10.0, period="1s", max_grant_amount=2,
                            classes={"a": {"weight": 1.0}, "b": {"weight": 1.0}}),
                       now=0.0, on_chunk=lambda r, c, t: chunks.append((r.class_id, c, t)))
    queue.bucket.take(10.0, 0.0)
    queue.submit(6, 0.0, class_id="a")
    queue.submit(6, 0.0, class_id="b")
    run_until(queue, 0.0, 10.0)
    assert [c[0] for c in chunks] == ["a", "b", "a", "b", "a", "b"]
    assert [c[2] for c in chunks] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.2])
    assert all(c[1] == 2.0 for c in chunks)


def test_chunked_request_resolves_once_after_full_amount() -> None:
    queue = QuotaQueue(spec(limit=10.0, period="1s", max_grant_amount=3), now=0.0)
    request = queue.submit(25, 0.0)
    resolved = run_until(queue, 0.0, 10.0)
    # 10 burst (3+3+3, then 1 left: next chunk of 3 waits 0.2 s) ... exactly 25 units by t = 1.5
    assert resolved == [(pytest.approx(1.5), request)]
    assert request.granted == 25.0


def test_request_larger_than_burst_is_chunked_by_capacity() -> None:
    queue = QuotaQueue(spec(limit=100.0, period="1s"), now=0.0)
    chunks: list[float] = []
    queue._on_chunk = lambda r, c, t: chunks.append(t)
    request = queue.submit(300, 0.0)
    assert run_until(queue, 0.0, 10.0) == [(2.0, request)]
    assert chunks == [0.0, 1.0, 2.0]


def test_chunked_request_canceled_mid_way_does_not_block_others() -> None:
    queue = QuotaQueue(spec(limit=10.0, period="1s", max_grant_amount=5), now=0.0)
    queue.bucket.take(10.0, 0.0)
    big = queue.submit(1000, 0.0, timestamp=1.0)
    other = queue.submit(5, 0.0, timestamp=2.0)
    run_until(queue, 0.0, 2.0)
    assert big.granted == 20.0
    assert not big.done
    queue.cancel(big, 2.0)  # its last chunk (5) comes back; older chunks the bucket would have refilled anyway
    assert queue.bucket.tokens(2.0) == 5.0
    assert queue.poll(2.0) == [other]
    assert queue.queue_size == 0


def test_cancel_right_after_chunks_refunds_everything() -> None:
    queue = QuotaQueue(spec(limit=10.0, period="1s", max_grant_amount=4), now=0.0)
    request = queue.submit(100, 0.0)
    queue.poll(0.0)  # 4 + 4 taken at once, 2 left
    assert request.granted == 8.0
    queue.cancel(request, 0.0)
    assert queue.bucket.tokens(0.0) == 10.0
    assert queue.class_counters()["default"] == (0.0, 8.0, 1.0)


def test_retired_class_with_backlog_is_erased_after_draining() -> None:
    queue = QuotaQueue(spec(limit=1.0, period="1s", classes={"a": {"weight": 1.0}, "b": {"weight": 1.0}}), now=0.0)
    queue.bucket.take(1.0, 0.0)
    old = [queue.submit(1, 0.0, class_id="b", timestamp=float(i)) for i in range(2)]
    queue.reconfigure(spec(limit=1.0, period="1s", classes={"a": {"weight": 1.0}}), now=0.0)
    assert queue.is_retired("b")
    newcomer = queue.submit(1, 0.0, class_id="b", timestamp=-1.0)
    assert newcomer.class_id == "default"
    assert queue.unknown_class_requests == 1
    resolved = [r for _, r in run_until(queue, 0.0, 10.0)]
    assert set(resolved) == {*old, newcomer}
    assert queue.class_ids() == ["a", "default"]


def test_retired_class_revives_when_declared_again_while_draining() -> None:
    queue = QuotaQueue(spec(limit=1.0, classes={"b": {"weight": 2.0}}), now=0.0)
    queue.bucket.take(10.0, 0.0)
    queue.submit(1, 0.0, class_id="b")
    queue.reconfigure(spec(limit=1.0, classes={"x": {"weight": 1.0}}), now=0.0)
    assert queue.is_retired("b")
    queue.reconfigure(spec(limit=1.0, classes={"b": {"weight": 3.0}}), now=0.0)
    assert not queue.is_retired("b")
    assert queue.submit(1, 0.0, class_id="b").class_id == "b"


def test_limit_zero_grants_nothing_and_never_wakes() -> None:
    queue = QuotaQueue(spec(limit=0.0), now=0.0)
    queue.submit(1, 0.0)
    assert queue.poll(100.0) == []
    assert queue.next_ready(100.0) is None


def test_use_class_weights_as_limit_sets_rate() -> None:
    queue = QuotaQueue(spec(use_class_weights_as_limit=True, period="1s",
                            classes={"vip": {"weight": 5.0}, "regular": {"weight": 3.0}, "bulk": {"weight": 1.0}}),
                       now=0.0)
    assert queue.bucket.rate == 9.0
    assert queue.bucket.capacity == 9.0


def test_reconfigure_clamps_tokens_to_new_capacity() -> None:
    queue = QuotaQueue(spec(limit=100.0, period="1s"), now=0.0)
    queue.reconfigure(spec(limit=10.0, period="1s"), now=0.0)
    assert queue.bucket.tokens(0.0) == 10.0
    queue.bucket.take(10.0, 0.0)
    queue.reconfigure(spec(limit=100.0, period="1s"), now=0.0)
    assert queue.bucket.tokens(0.0) == 0.0
    assert queue.bucket.tokens(0.5) == 50.0
