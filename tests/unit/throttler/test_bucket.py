"""Token bucket and the per-throttler quota queue: mirrors upstream's bucket tests, exact times."""

from __future__ import annotations

from typing import Any

import pytest

from egress.throttler.bucket import TokenBucket
from egress.throttler.envelope import worst_excess
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
    # The bucket never filled up while big held its 20 units, so without big it would be full now:
    # everything comes back, up to the capacity (10).
    queue.cancel(big, 2.0)
    assert queue.bucket.tokens(2.0) == 10.0
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


# -- leases and the release stage ------------------------------------------------------------------


def test_leased_units_keep_their_room_until_the_lease_ends() -> None:
    bucket = TokenBucket(10.0, 1.0, now=0.0)
    bucket.lease(10.0, 0.0, until=0.5)  # may be used as late as 0.5 s: the bucket refills from then
    assert bucket.leased == 10.0
    assert bucket.tokens(0.5) == 0.0
    assert bucket.ready_at(5.0, 0.0) == 1.0
    assert bucket.tokens(1.0) == 5.0
    assert bucket.leased == 0.0
    bucket.lease(5.0, 1.0, until=1.0)  # used at once: an ordinary take
    assert bucket.leased == 0.0
    assert bucket.tokens(1.5) == 5.0


def test_room_grows_lease_by_lease() -> None:
    bucket = TokenBucket(10.0, 1.0, now=0.0)
    bucket.lease(4.0, 0.0, until=2.0)
    bucket.lease(6.0, 0.0, until=3.0)
    assert bucket.ready_at(4.0, 0.0) == 2.4  # room for 4 once the first lease ends, then 0.4 s of refill
    assert bucket.ready_at(10.0, 0.0) == pytest.approx(3.6)  # 4 by 2.4, 6 more once the second ends
    assert bucket.tokens(2.4) == pytest.approx(4.0)


def test_a_lease_beyond_the_burst_leaves_the_bucket_below_zero() -> None:
    bucket = TokenBucket(10.0, 1.0, now=0.0)
    bucket.take(1.0, 0.0)
    with pytest.raises(ValueError, match="cannot lease"):
        bucket.lease(11.0, 0.0, until=0.0)  # needs a full bucket first
    bucket = TokenBucket(10.0, 1.0, now=0.0)
    bucket.lease(25.0, 0.0, until=0.0)
    assert bucket.tokens(0.0) == -15.0
    assert bucket.ready_at(10.0, 0.0) == 2.5


def test_a_bucket_empty_since_a_later_time_grants_nothing_before_it() -> None:
    bucket = TokenBucket(10.0, 1.0, now=0.0, empty_since=2.0)
    assert bucket.tokens(1.0) == 0.0
    assert bucket.ready_at(5.0, 0.0) == 2.5
    earlier = TokenBucket(10.0, 1.0, now=5.0, empty_since=4.8)  # empty 0.2 s ago: 2 units refilled since
    assert earlier.tokens(5.0) == pytest.approx(2.0)


def test_a_smaller_capacity_leaves_room_only_beyond_the_leases() -> None:
    bucket = TokenBucket(10.0, 2.0, now=0.0)
    bucket.lease(15.0, 0.0, until=1.0)
    bucket.reconfigure(10.0, 1.0, now=0.0)  # capacity 10 < 15 leased: nothing left, none refilled
    assert bucket.tokens(0.5) == 0.0
    assert bucket.tokens(1.5) == 5.0


def test_requests_granted_in_chunks_are_not_released_together_beyond_the_burst() -> None:
    # Two classes each ask for the whole burst, served in interleaved chunks of 1: both have their
    # last chunk around t = 1 s. Releasing both then would hand out 20 units within 0.1 s with a
    # burst of 10; the release bucket lets the second go one refill (1 s) after the first.
    queue = QuotaQueue(spec(limit=10.0, period="1s", max_grant_amount=1, classes={"a": {}, "c": {}}), now=0.0)
    first = queue.submit(10, 0.0, class_id="a")
    second = queue.submit(10, 0.0, class_id="c")
    resolved = run_until(queue, 0.0, 10.0)
    assert [r for _, r in resolved] == [first, second]
    (t1, _), (t2, _) = resolved
    assert t1 == pytest.approx(0.9)
    assert t2 == pytest.approx(t1 + 1.0)
    assert worst_excess([(t, r.amount) for t, r in resolved], 10.0, 10.0) <= 1e-9


def test_a_request_that_fitted_the_burst_gets_the_new_burst_when_it_shrank() -> None:
    queue = QuotaQueue(spec(limit=10.0, period="2s"), now=0.0)
    queue.bucket.take(20.0, 0.0)
    queue.release_bucket.take(20.0, 0.0)
    request = queue.submit(15, 0.0)  # fits the burst of 20 when asked
    queue.reconfigure(spec(limit=10.0, period="1s"), 0.0)  # the burst is 10 now
    resolved = run_until(queue, 0.0, 10.0)
    assert resolved == [(pytest.approx(1.5), request)]
    assert request.released == 10.0  # the caller asks again for the other 5


def test_one_call_beyond_the_burst_is_released_whole_from_a_full_bucket() -> None:
    queue = QuotaQueue(spec(limit=10.0, period="1s"), now=0.0)
    request = queue.submit(25, 0.0)
    assert request.whole
    resolved = run_until(queue, 0.0, 10.0)
    assert resolved == [(1.5, request)]  # granted in chunks of 10 (the bucket's capacity)
    assert request.released == 25.0
    assert queue.release_bucket.tokens(1.5) == -15.0  # nothing more goes out until it is paid back
