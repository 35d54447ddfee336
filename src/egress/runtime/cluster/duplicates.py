"""One running process per worker id.

Two processes under one ``--worker-id`` would each take the other's leases back (a lease of the
same owner is always granted), many times a second, and lose the per-key order. So each worker
process draws a random instance token and writes it into its membership record with the time of
each renewal (``renewed_at``, on its clock) and its ``heartbeat_period``.

A starting worker that finds a live record under its id with another token
(:func:`claim_worker_id`) cannot tell from the record alone whether that process crashed (a
SIGKILL leaves its record listed until it lapses) or still runs, so it watches the record: renewed
by its owner (``renewed_at`` moves) within the owner's heartbeat period, it is a live duplicate and
the starting worker is refused with :class:`DuplicateWorkerError`; not renewed, it is a crashed
predecessor's and is taken over. The wait lasts until that renewal is overdue: at most one heartbeat
period and :data:`RENEWAL_SLACK`; on the same host (the same wall clock) it is counted from the
record's ``renewed_at``, so a restart a heartbeat period after the crash waits nothing, and none
at all when the record's pid is no process of this host (the common restart: the crashed process
is gone; a pid reused by another process only costs the wait). "This host" is the host name and
the process space (:func:`process_space`: the kernel's boot and the pid namespace): two containers
on one machine may share a host name while each numbers its own processes, and two machines may
share one (``localhost``), so a pid is probed and a wall clock trusted only within one space.

Two that start at once, or a duplicate that missed a late renewal, both run: at each heartbeat a
worker looks at its own record before renewing it (:func:`duplicate_of`); written by another live
instance since, the one that started later (``started_at``, then the token) stops with
:class:`DuplicateWorkerError` and the other goes on. Each sees the other's write within a heartbeat
period, so they trade leases for at most that long.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from egress.clock import Clock
from egress.engines import MemberInfo, Membership
from egress.errors import EgressError, printable

INSTANCE = "instance"
"""The ``details`` key of a member's instance token (a hex uuid4, one per process)."""
RENEWED_AT = "renewed_at"
"""The ``details`` key of a member's last registration time (seconds since the epoch, its clock)."""
HEARTBEAT_PERIOD = "heartbeat_period"
"""The ``details`` key of the seconds between a member's registrations."""
RENEWAL_SLACK = 0.25
"""Seconds a renewal may come after its heartbeat period (its write and the listing that sees it)."""
CLAIM_POLL = 0.1
"""Seconds between two listings while a starting worker watches a record under its id."""
PROCESS_SPACE = "process_space"
"""The ``details`` key of a member's :func:`process_space`."""


class DuplicateWorkerError(EgressError):
    """Another live process runs under this worker's id; the message names the id, the other
    process (host and pid) and the fix."""


def new_instance() -> str:
    """A random instance token: 32 hex digits."""
    return uuid.uuid4().hex


def process_of(record: MemberInfo) -> str:
    """``pid PID on HOST`` of the process that wrote ``record`` (``another egress process``
    when it names neither)."""
    host, pid = record.details.get("host"), record.details.get("pid")
    return f"pid {pid} on {host}" if host is not None and pid is not None else "another egress process"


def duplicate_error(worker_id: str, other: MemberInfo) -> DuplicateWorkerError:
    """The error of a worker whose id the live process of record ``other`` runs under."""
    return DuplicateWorkerError(printable(
        f"worker id {worker_id!r} is in use: {process_of(other)} is running under it; give each running worker "
        "its own --worker-id, or stop the other one"))


def renewal(record: MemberInfo) -> tuple[Any, Any]:
    """What changes with each registration of a record: its instance token and ``renewed_at``."""
    return record.details.get(INSTANCE), record.details.get(RENEWED_AT)


def own_record(members: Sequence[MemberInfo], worker_id: str) -> MemberInfo | None:
    return next((member for member in members if member.worker_id == worker_id), None)


def process_space() -> str | None:
    """Where this process's pid means this process: ``BOOT_ID/PID_NAMESPACE_INODE`` (Linux's
    ``/proc/sys/kernel/random/boot_id`` and the inode of ``/proc/self/ns/pid``); ``None`` where
    ``/proc`` has neither (then the host name alone tells hosts apart)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}/{namespace}"


def same_host(record: MemberInfo, host: str, space: str | None) -> bool:
    """Whether ``record``'s process ran on ``host`` in process ``space`` (:func:`process_space`):
    where its pid can be probed and its wall clock is this one's."""
    return record.details.get("host") == host and record.details.get(PROCESS_SPACE) == space


def process_exists(pid: int) -> bool:
    """Whether a process ``pid`` other than this one runs on this host (signal 0 probes it)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    except (OverflowError, ValueError):
        return False
    return True


def watch_time(record: MemberInfo, now: float, heartbeat_period: float, host: str,
               exists: Callable[[int], bool] = process_exists, space: str | None = None) -> float:
    """Seconds to watch ``record`` (another instance's, listed at ``now`` on this worker's clock)
    for a renewal before taking it over: until its owner's next renewal is overdue by
    :data:`RENEWAL_SLACK`, at most its ``heartbeat_period`` (``heartbeat_period`` when it names none)
    and that slack; on another host (another clock) that whole bound; 0 on this ``host`` (in
    process ``space``: :func:`same_host`) when no process of its pid ``exists``."""
    period = float(record.details.get(HEARTBEAT_PERIOD, heartbeat_period))
    longest = period + RENEWAL_SLACK
    if not same_host(record, host, space):
        return longest
    pid = record.details.get("pid")
    if isinstance(pid, int) and not exists(pid):
        return 0.0
    renewed_at = record.details.get(RENEWED_AT)
    if not isinstance(renewed_at, int | float):
        return longest
    return max(0.0, min(longest, float(renewed_at) + longest - now))


async def claim_worker_id(membership: Membership, worker_id: str, instance: str, clock: Clock, *,
                          heartbeat_period: float, host: str | None = None, space: str | None = None,
                          exists: Callable[[int], bool] = process_exists) -> MemberInfo | None:
    """Make sure no other live process runs under ``worker_id`` before this one (token
    ``instance``) joins: return at once when no other instance's record is listed under it; else
    list it every :data:`CLAIM_POLL` seconds for :func:`watch_time` seconds (``host``: this one's
    name, ``space``: its :func:`process_space`, both this process's when ``host`` is ``None``;
    ``exists``: whether a pid runs in it), and raise
    :class:`DuplicateWorkerError` once it is renewed, return ``None`` once it is gone (its process
    left), and return the record (a crashed predecessor's, taken over) when it was not renewed."""
    if host is None:
        host, space = socket.gethostname(), process_space()
    first = own_record(await membership.members(), worker_id)
    if first is None or first.details.get(INSTANCE) == instance:
        return None
    deadline = clock.monotonic() + watch_time(first, clock.now(), heartbeat_period, host, exists, space)
    while (left := deadline - clock.monotonic()) > 0:
        await clock.sleep(min(CLAIM_POLL, left))
        listed = own_record(await membership.members(), worker_id)
        if listed is None:
            return None
        if renewal(listed) != renewal(first):
            raise duplicate_error(worker_id, listed)
    return first


def duplicate_of(members: Sequence[MemberInfo], me: MemberInfo, taken_over: tuple[Any, Any] | None) -> \
        MemberInfo | None:
    """The record listed under ``me``'s worker id when another instance wrote it (not the
    :func:`renewal` ``taken_over`` of a crashed predecessor): a live duplicate, as ``me``'s own
    registration came before."""
    listed = own_record(members, me.worker_id)
    if listed is None or listed.details.get(INSTANCE) == me.details.get(INSTANCE) or renewal(listed) == taken_over:
        return None
    return listed


def started_before(one: MemberInfo, other: MemberInfo) -> bool:
    """Whether ``one`` started before ``other`` (``started_at``, then the instance token): of two
    processes under one id the later leaves."""
    def order(member: MemberInfo) -> tuple[float, str]:
        return float(member.details.get("started_at", 0.0)), str(member.details.get(INSTANCE, ""))
    return order(one) < order(other)
