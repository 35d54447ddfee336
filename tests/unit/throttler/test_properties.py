"""Property tests (hypothesis) of the quota queue, the contract's bounds, on exact simulated time."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from egress.throttler.bucket import TokenBucket
from egress.throttler.errors import QuotaAmountError
from egress.throttler.models import ThrottlerSpec
from egress.throttler.queue import QuotaQueue, QuotaRequest

# EGRESS_HYPOTHESIS_EXAMPLES=2000 for a long hunt; the default keeps the suite fast.
SETTINGS = settings(max_examples=int(os.environ.get("EGRESS_HYPOTHESIS_EXAMPLES", "60")), deadline=None)
SLACK = 1e-6
PERIODS = st.integers(100, 3000).map(lambda ms: ms / 1000)


@dataclass
class Arrival:
    time: float
    amount: int
    class_id: str | None
    timestamp: float
    cancel_after: float | None = None


@dataclass
class Trace:
    chunks: list[tuple[float, float, QuotaRequest]] = field(default_factory=list)
    requests: list[QuotaRequest] = field(default_factory=list)


def simulate(queue: QuotaQueue, arrivals: list[Arrival], horizon: float,
             changes: list[tuple[float, ThrottlerSpec]] | None = None) -> Trace:
    """Drive ``queue`` like the controller: events are arrivals, cancels, spec changes, ready times."""
    trace = Trace()
    queue._on_chunk = lambda request, chunk, now: trace.chunks.append((now, chunk, request))
    pending = sorted(arrivals, key=lambda a: a.time)
    cancels: list[tuple[float, QuotaRequest]] = []
    changes = sorted(changes or [], key=lambda c: c[0])
    now = 0.0
    while True:
        candidates = [a.time for a in pending[:1]] + [c[0] for c in cancels] + [c[0] for c in changes[:1]]
        ready = queue.next_ready(now)
        if ready is not None:
            candidates.append(ready)
        if not candidates:
            break
        now = max(now, min(candidates))
        if now > horizon:
            break
        while changes and changes[0][0] <= now:
            queue.reconfigure(changes.pop(0)[1], now)
        while pending and pending[0].time <= now:
            arrival = pending.pop(0)
            request = queue.submit(arrival.amount, now, timestamp=arrival.timestamp, class_id=arrival.class_id)
            trace.requests.append(request)
            if arrival.cancel_after is not None:
                cancels.append((now + arrival.cancel_after, request))
        for due in [c for c in cancels if c[0] <= now]:
            cancels.remove(due)
            queue.cancel(due[1], now)
        queue.poll(now)
    return trace


arrivals_strategy = st.lists(
    st.builds(Arrival, time=st.floats(0, 20).map(lambda x: round(x, 3)), amount=st.integers(0, 60),
              class_id=st.sampled_from([None, "a", "b", "c", "zz"]), timestamp=st.floats(0, 100),
              cancel_after=st.none() | st.floats(0, 5)),
    min_size=1, max_size=60)


def spec_of(limit: float, period: float, m: int | None, classes: dict[str, float]) -> ThrottlerSpec:
    return ThrottlerSpec.model_validate({"limit": limit, "period": f"{round(period * 1000)}ms", "max_grant_amount": m,
                                         "classes": {c: {"weight": w} for c, w in classes.items()}})


classes_strategy = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.floats(0.1, 10), max_size=3)


@SETTINGS
@given(arrivals=arrivals_strategy, limit=st.floats(1, 50), new_limit=st.floats(1, 50), period=PERIODS,
       m=st.none() | st.integers(1, 20), classes=classes_strategy, change_at=st.floats(0, 20))
def test_envelope_over_every_window_with_a_limit_change(
    arrivals: list[Arrival], limit: float, new_limit: float, period: float, m: int | None,
    classes: dict[str, float], change_at: float,
) -> None:
    queue = QuotaQueue(spec_of(limit, period, m, classes), now=0.0)
    trace = simulate(queue, arrivals, horizon=60.0,
                     changes=[(change_at, spec_of(new_limit, period, m, classes))])
    kept = [(t, c) for t, c, r in trace.chunks if not r.cancelled]

    def integral(t1: float, t2: float) -> float:
        before = max(0.0, min(t2, change_at) - t1)
        after = max(0.0, t2 - max(t1, change_at))
        return limit * before + new_limit * after

    burst = max(limit, new_limit) * period
    for i, (t1, _) in enumerate(kept):  # every window that starts and ends at a grant: the worst ones
        total = 0.0
        for t2, chunk in kept[i:]:
            total += chunk
            assert total <= integral(t1, t2) + burst + SLACK * max(1.0, total)
    for _, chunk, _ in trace.chunks:
        if m is not None:
            assert chunk <= m + SLACK  # no grant exceeds max_grant_amount
        assert chunk <= max(limit, new_limit) * period + SLACK  # nor the burst


@SETTINGS
@given(arrivals=arrivals_strategy, limit=st.floats(1, 50), period=PERIODS,
       m=st.none() | st.integers(1, 20), classes=classes_strategy)
def test_denied_or_cancelled_requests_consume_nothing(
    arrivals: list[Arrival], limit: float, period: float, m: int | None, classes: dict[str, float],
) -> None:
    queue = QuotaQueue(spec_of(limit, period, m, classes), now=0.0)
    tokens_before = queue.bucket.tokens(0.0)
    with contextlib.suppress(QuotaAmountError):
        queue.submit(-1, 0.0)
    assert queue.bucket.tokens(0.0) == tokens_before
    assert queue.queue_size == 0
    trace = simulate(queue, arrivals, horizon=200.0)
    end = max([t for t, _, _ in trace.chunks] + [a.time + (a.cancel_after or 0) for a in arrivals]) + 1.0
    for request in trace.requests:
        queue.cancel(request, end)  # whatever still waits
    # A bucket that saw only the chunks of requests that were not cancelled holds at least as many tokens
    # (the refund never breaks the envelope of what was kept), and once it could have refilled both are
    # full: nothing cancelled is charged for good.
    replay = TokenBucket(limit, period, 0.0)
    for t, chunk, request in trace.chunks:
        if not request.cancelled:
            replay._refill(t)
            replay._tokens -= chunk
    assert queue.bucket.tokens(end) <= replay.tokens(end) + SLACK * max(1.0, limit * period)
    full = limit * period
    assert abs(queue.bucket.tokens(end + 2 * period) - full) <= SLACK * full
    assert abs(replay.tokens(end + 2 * period) - full) <= SLACK * full
    done = sum(r.amount for r in trace.requests if r.done)
    assert abs(queue.granted_total - done) <= SLACK * max(1.0, done)
    assert all(abs(r.granted - r.amount) <= SLACK * max(1.0, r.amount) for r in trace.requests if r.done)


weights_strategy = st.lists(st.floats(0.2, 10), min_size=2, max_size=4)


@SETTINGS
@given(weights=weights_strategy, limit=st.floats(5, 200), new_limit=st.floats(5, 200), m=st.integers(1, 30),
       chunk_sizes=st.lists(st.integers(1, 80), min_size=4, max_size=4), horizon=st.floats(5, 60),
       cut=st.floats(0, 1), length=st.floats(0, 1), change=st.floats(0, 1))
def test_backlogged_classes_stay_within_the_sfq_bound(
    weights: list[float], limit: float, new_limit: float, m: int, chunk_sizes: list[int], horizon: float,
    cut: float, length: float, change: float,
) -> None:
    names = [f"k{i}" for i in range(len(weights))]
    classes = dict(zip(names, weights, strict=True))
    queue = QuotaQueue(spec_of(limit, 1.0, m, classes), now=0.0)
    # Every class always has plenty waiting (random request sizes), so all stay backlogged, while the
    # limit changes mid-run (SFQ's bound does not depend on the service rate).
    most = max(limit, new_limit)
    arrivals = [Arrival(0.0, chunk_sizes[i % 4], name, float(j)) for i, name in enumerate(names)
                for j in range(int(most * (horizon + 1) / chunk_sizes[i % 4]) + 2)]
    changed = spec_of(new_limit, 1.0, m, classes)
    trace = simulate(queue, arrivals, horizon=horizon, changes=[(change * horizon, changed)])
    start = int(cut * len(trace.chunks))  # any interval: a random window of the trace
    end = start + int(length * (len(trace.chunks) - start))
    served = {name: 0.0 for name in names}
    for _, chunk, request in trace.chunks[start:end]:
        served[request.class_id] += chunk
    total, weight_sum, n = sum(served.values()), sum(weights), len(weights)
    for name, weight in zip(names, weights, strict=True):
        ideal = weight / weight_sum * total
        assert abs(served[name] - ideal) <= m * (1 + n * weight / weight_sum) + SLACK * total


@SETTINGS
@given(weights=st.lists(st.floats(0.2, 10), min_size=2, max_size=2), limit=st.floats(5, 200),
       m=st.integers(1, 30), idle_for=st.floats(1, 30), after=st.floats(1, 20))
def test_idle_class_banks_nothing(weights: list[float], limit: float, m: int, idle_for: float, after: float) -> None:
    queue = QuotaQueue(spec_of(limit, 1.0, m, {"busy": weights[0], "late": weights[1]}), now=0.0)
    count = int(limit * (idle_for + after + 1)) + 2
    arrivals = [Arrival(0.0, 1, "busy", float(j)) for j in range(count)]
    arrivals += [Arrival(idle_for, 1, "late", float(j)) for j in range(count)]
    trace = simulate(queue, arrivals, horizon=idle_for + after)
    late_chunks = [(t, c, r) for t, c, r in trace.chunks if t >= idle_for]
    served = {"busy": 0.0, "late": 0.0}
    for _, chunk, request in late_chunks:
        served[request.class_id] += chunk
    total = sum(served.values())
    share = weights[1] / sum(weights)
    # From its wake-up on the late class gets its share, not more: no credit for the idle time.
    assert served["late"] <= share * total + m * (1 + 2 * share) + SLACK * total
    # and it is served within about n·m/limit seconds of waking (one chunk of the other class at most)
    first_late = min(t for t, _, r in trace.chunks if r.class_id == "late")
    assert first_late <= idle_for + 2 * m / limit + 1e-9
