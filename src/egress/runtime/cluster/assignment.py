"""Which worker of a cluster runs which unit of work: rendezvous hashing with bounded loads.

A **unit** (:class:`egress.runtime.unit.Unit`) is a computation's partition job or a source
reader, what the engine leases as ``(consumer, partition)``. Every worker computes the
same assignment from the same inputs (the Spec's units and the live members' ids), so workers agree
without talking to each other; the leases arbitrate while their views of the members differ.

The weight of a (unit, member) pair is the first 8 bytes of BLAKE2b over both names (stable across
processes, machines and Python versions, unlike ``hash()``): rendezvous (highest-random-weight)
hashing. Pure rendezvous gives each unit to its heaviest member, so a member that joins takes only
units that move to it, but the loads are random (with 5 units and 2 workers, one gets all 5 in one
case of 16). Here the pairs are taken heaviest first and a member stops taking units at its share:
``units // members``, plus one for the first ``units % members`` members to fill up. So every member
runs ``floor(U/N)`` or ``ceil(U/N)`` units; this is the stable matching of units to members under
those capacities (neither a unit nor a member would rather have the other's partner).

No assignment can have both exact balance and "a join moves only units to the new member" for every
set of members (with 3 units and enough member ids, two units always share a member among some
three); this one keeps the balance exact and moves few units between old members on a join (on
average about one, against U/(N+1) moved to the joiner; ``tests/unit/runtime/test_assignment.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Set
from dataclasses import dataclass

from egress.runtime.unit import Unit


def weight(unit: Unit, member: str) -> int:
    """The rendezvous weight of ``unit`` on ``member``: a 64-bit integer from BLAKE2b over the
    unit's engine key (``Unit.consumer``, partition) and the member's id."""
    text = f"{unit.consumer}\x00{unit.partition}\x00{member}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def assign(units: Iterable[Unit], members: Iterable[str]) -> dict[Unit, str]:
    """The member that should run each unit (``{}`` without members). Every member gets
    ``floor(U/N)`` or ``ceil(U/N)`` units; the result depends only on the two sets, not their order."""
    unit_list, member_list = sorted(set(units)), sorted(set(members))
    if not member_list:
        return {}
    share, larger = divmod(len(unit_list), len(member_list))
    pairs = sorted(((weight(u, m), u, m) for u in unit_list for m in member_list), reverse=True)
    load = dict.fromkeys(member_list, 0)
    owners: dict[Unit, str] = {}
    for _, unit, member in pairs:
        if unit in owners or load[member] >= share + (1 if larger else 0):
            continue
        owners[unit] = member
        load[member] += 1
        if load[member] == share + 1:
            larger -= 1  # one fewer member may still go above the share
    return owners


def units_of(owners: dict[Unit, str], member: str) -> set[Unit]:
    """The units ``owners`` gives to ``member``."""
    return {unit for unit, owner in owners.items() if owner == member}


@dataclass(frozen=True, slots=True)
class Changes:
    """What a worker does next: ``take`` (desired, not running: ``try_acquire`` them) and
    ``hand_over`` (running, no longer desired: finish the epoch, commit, ``release``)."""

    take: frozenset[Unit]
    hand_over: frozenset[Unit]


def changes(desired: Set[Unit], running: Set[Unit], stopping: Set[Unit] = frozenset()) -> Changes:
    """The next step from the units a worker should run (``desired``) to the ones it runs
    (``running``); units being handed over (``stopping``) are neither taken nor handed over again."""
    return Changes(frozenset(desired - running - stopping), frozenset(running - desired - stopping))
