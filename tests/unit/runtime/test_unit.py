"""A unit's engine key is the one state directories and buckets already hold; units sort as the engine's leases."""

from __future__ import annotations

from egress.runtime.unit import Unit


def test_the_consumer_keys_are_the_computation_id_and_source_colon_id() -> None:
    assert Unit.computation("deliver", 3).key == ("deliver", 3)
    assert Unit.source("events").key == ("source:events", 0)


def test_units_sort_by_consumer_key_then_partition() -> None:
    units = [Unit.computation("zeta", 0), Unit.source("events"), Unit.computation("deliver", 1),
             Unit.computation("deliver", 0)]
    assert [unit.key for unit in sorted(units)] == sorted(unit.key for unit in units)
