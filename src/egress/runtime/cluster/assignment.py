"""Which worker of a cluster runs which unit of work: rendezvous hashing with bounded loads.

A **unit** (:class:`egress.runtime.unit.Unit`) is a computation's partition job or a source
reader, what the engine leases as ``(consumer, partition)``. Every worker computes the
same assignment from the same inputs (the Spec's units and the live members' ids), so workers agree
without talking to each other; the leases arbitrate while their views of the members differ.

The weight of a (unit, member) pair is the first 8 bytes of BLAKE2b over both names (stable across
processes, machines and Python versions, unlike ``hash()``): rendezvous (highest-random-weight)
hashing. Pure rendezvous gives each unit to its heaviest member, so a member that joins takes only
units that move to it, but the loads are random (with 5 units and 2 workers, one gets all 5 in one
case of 16). Here the units are balanced per group of units doing the same work (a computation's
partitions, a source's readers): within a group the pairs are taken heaviest first and a member
stops taking units at its share of the group, ``G // members``, plus one for the first ``G % members``
members (the least loaded by the groups before). So every member runs ``floor(G/N)`` or
``ceil(G/N)`` units of each group and ``floor(U/N)`` or ``ceil(U/N)`` in all: the work of each
computation, not only the count of units, is even.

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
    """The member that should run each unit (``{}`` without members). The units are balanced per
    group (a computation's partitions, a source's readers: :func:`groups`), each member getting
    ``floor(G/N)`` or ``ceil(G/N)`` of a group of ``G``, the ``ceil`` going to the members least
    loaded by the groups before; so every member also runs ``floor(U/N)`` or ``ceil(U/N)`` units in
    all. The result depends only on the two sets, not their order."""
    member_list = sorted(set(members))
    if not member_list:
        return {}
    load = dict.fromkeys(member_list, 0)
    owners: dict[Unit, str] = {}
    for group in groups(units):
        share, larger = divmod(len(group), len(member_list))
        # One more of this group for the least loaded so far: all those below the threshold load,
        # and of those at it, the first to fill up in rendezvous order (``open_extras`` of them).
        threshold = sorted(load.values())[larger - 1] if larger else -1
        room = {m: share + (1 if load[m] < threshold else 0) for m in member_list}
        tied = {m for m in member_list if load[m] == threshold}
        open_extras = larger - sum(1 for m in member_list if load[m] < threshold)
        pairs = sorted(((weight(u, m), u, m) for u in group for m in member_list), reverse=True)
        for _, unit, member in pairs:
            if unit in owners:
                continue
            if not room[member]:
                if member not in tied or not open_extras:
                    continue
                open_extras -= 1
                tied.discard(member)
                room[member] = 1
            owners[unit] = member
            room[member] -= 1
            load[member] += 1
    return owners


def groups(units: Iterable[Unit]) -> list[list[Unit]]:
    """``units`` by what does the same work: each computation's partitions, each source's readers;
    smallest groups first (then by name; measured: fewer units move between old members on a join
    than largest first), each sorted. Balancing each group alone spreads the work
    of a computation (its POSTs) over the members, where balancing only the count of units could
    leave three of four delivering partitions on one of two members and the source's reader on the
    other (75 % / 25 % of the POSTs, issue 24)."""
    by_name: dict[tuple[str, str], list[Unit]] = {}
    for unit in sorted(set(units)):
        by_name.setdefault((unit.kind, unit.name), []).append(unit)
    return [by_name[key] for key in sorted(by_name, key=lambda key: (len(by_name[key]), key))]


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
