"""SFQ class scheduler, pure: mirrors upstream's scheduler tests (names in the contract)."""

from __future__ import annotations

from collections import Counter

import pytest

from egress.throttler.scheduler import ClassScheduler


def serve(scheduler: ClassScheduler, rounds: int, chunk: float = 1.0) -> Counter[str]:
    """Serve ``rounds`` chunks to whichever class the scheduler selects (all stay backlogged)."""
    served: Counter[str] = Counter()
    for _ in range(rounds):
        chosen = scheduler.select()
        assert chosen is not None
        scheduler.charge(chosen, chunk)
        served[chosen] += 1
    return served


def test_single_class_preserves_head_priority() -> None:
    scheduler = ClassScheduler({"a": 1.0})
    scheduler.activate("a")
    assert [scheduler.select() for _ in range(3)] == ["a", "a", "a"]
    scheduler.deactivate("a")
    assert scheduler.select() is None


@pytest.mark.parametrize("weights", [{"a": 3.0, "b": 1.0}, {"vip": 5.0, "regular": 3.0, "bulk": 1.0}])
def test_backlogged_classes_follow_weights(weights: dict[str, float]) -> None:
    scheduler = ClassScheduler(weights)
    for class_id in weights:
        scheduler.activate(class_id)
    served = serve(scheduler, 9000)
    total = sum(weights.values())
    for class_id, weight in weights.items():
        assert served[class_id] / 9000 == pytest.approx(weight / total, abs=0.01)


def test_inactive_class_is_excluded() -> None:
    scheduler = ClassScheduler({"a": 1.0, "b": 1.0, "c": 8.0})
    scheduler.activate("a")
    scheduler.activate("b")
    served = serve(scheduler, 1000)
    assert served == Counter({"a": 500, "b": 500})


def test_idle_share_is_redistributed() -> None:
    scheduler = ClassScheduler({"a": 2.0, "b": 1.0, "c": 1.0})
    for class_id in "abc":
        scheduler.activate(class_id)
    serve(scheduler, 400)
    scheduler.deactivate("a")
    served = serve(scheduler, 1000)
    assert served == Counter({"b": 500, "c": 500})


def test_waking_class_does_not_bank_credit() -> None:
    scheduler = ClassScheduler({"a": 1.0, "b": 1.0})
    scheduler.activate("a")
    serve(scheduler, 1000)  # b idle all this time
    scheduler.activate("b")
    served = serve(scheduler, 100)
    assert abs(served["a"] - served["b"]) <= 1  # b gets its share from now on, no catch-up burst


def test_waking_class_preempts_single_backlog() -> None:
    scheduler = ClassScheduler({"a": 100.0, "b": 1.0})
    scheduler.activate("a")
    serve(scheduler, 50)
    scheduler.activate("b")
    assert scheduler.select() == "b"  # the very next chunk, despite the tiny weight


def test_weight_reconfigure_changes_subsequent_share() -> None:
    scheduler = ClassScheduler({"a": 1.0, "b": 1.0})
    scheduler.activate("a")
    scheduler.activate("b")
    assert serve(scheduler, 1000) == Counter({"a": 500, "b": 500})
    scheduler.set_weights({"a": 4.0, "b": 1.0})
    served = serve(scheduler, 5000)
    assert served["a"] / 5000 == pytest.approx(0.8, abs=0.01)


def test_charge_rollback_survives_weight_change() -> None:
    scheduler = ClassScheduler({"a": 1.0, "b": 1.0})
    scheduler.activate("a")
    scheduler.activate("b")
    cost = scheduler.charge("a", 10.0)  # a is 10 units ahead
    assert scheduler.select() == "b"
    scheduler.set_weights({"a": 4.0, "b": 1.0})
    scheduler.rollback("a", cost)  # undone with the cost charged, not one recomputed from the new weight
    assert scheduler.select() == "a"  # tie at v: broken by id
    scheduler2 = ClassScheduler({"a": 4.0, "b": 1.0})
    scheduler2.activate("a")
    scheduler2.activate("b")
    assert serve(scheduler, 500) == serve(scheduler2, 500)


def test_retired_class_drains_but_cannot_be_reactivated() -> None:
    scheduler = ClassScheduler({"a": 1.0, "b": 1.0})
    scheduler.activate("b")
    scheduler.set_weights({"a": 1.0})  # b removed: the scheduler forgets it
    assert scheduler.select() is None
    with pytest.raises(KeyError, match='unknown quota class "b"'):
        scheduler.activate("b")


def test_renormalization_preserves_selection_order() -> None:
    first = ClassScheduler({"a": 5.0, "b": 3.0, "c": 1.0})
    second = ClassScheduler({"a": 5.0, "b": 3.0, "c": 1.0})
    for scheduler in (first, second):
        for class_id in "abc":
            scheduler.activate(class_id)
        serve(scheduler, 37, chunk=3.0)
    second.set_weights({"a": 50.0, "b": 30.0, "c": 10.0})
    order_first = [(first.select(), first.charge(first.select() or "", 2.0))[0] for _ in range(200)]
    order_second = [(second.select(), second.charge(second.select() or "", 2.0))[0] for _ in range(200)]
    assert order_first == order_second


def test_non_positive_weight_is_rejected() -> None:
    with pytest.raises(ValueError, match="positive"):
        ClassScheduler({"a": 0.0})
