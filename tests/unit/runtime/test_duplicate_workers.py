"""One running process per worker id, on the virtual clock with exact times: a starting worker
that finds another instance's live record under its id is refused once that record is renewed,
and takes it over (a crashed predecessor's) once its renewal is overdue, at most one heartbeat
period and the slack later; a running worker whose record another instance wrote since its own
registration leaves when that one started first, and goes on (warned) when it started later."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from egress.clock import VirtualClock
from egress.engines import MemberInfo
from egress.observe import Metrics
from egress.runtime.cluster.duplicates import (
    CLAIM_POLL,
    HEARTBEAT_PERIOD,
    INSTANCE,
    PROCESS_SPACE,
    RENEWAL_SLACK,
    RENEWED_AT,
    DuplicateWorkerError,
    claim_worker_id,
    duplicate_of,
    process_exists,
    process_space,
    renewal,
    started_before,
    watch_time,
)
from egress.runtime.cluster.worker import Worker, WorkerSettings
from egress.runtime.jobs import JobSet

PERIOD = 2.5
START = 1_000.0
FIX = "give each running worker its own --worker-id, or stop the other one"


@dataclasses.dataclass
class MemoryMembership:
    """Members in memory, each listed until ``ttl`` after its registration on ``clock``; it answers
    what :class:`Worker` asks of an engine with no units to run."""

    clock: VirtualClock
    records: dict[str, tuple[MemberInfo, float]] = dataclasses.field(default_factory=dict)
    deregistered: list[str] = dataclasses.field(default_factory=list)

    async def register(self, member: MemberInfo, ttl: float) -> None:
        self.records[member.worker_id] = (member, self.clock.now() + ttl)

    async def deregister(self, worker_id: str) -> None:
        self.deregistered.append(worker_id)
        self.records.pop(worker_id, None)

    async def members(self) -> list[MemberInfo]:
        now = self.clock.now()
        return sorted((m for m, expires in self.records.values() if expires > now), key=lambda m: m.worker_id)


def record(instance: str, renewed_at: float, *, host: str = "host-a", pid: int = 41,
           started_at: float = START - 100) -> MemberInfo:
    return MemberInfo("w1", "digest", {"host": host, "pid": pid, "started_at": started_at, INSTANCE: instance,
                                       HEARTBEAT_PERIOD: PERIOD, RENEWED_AT: renewed_at})


async def heartbeats(membership: MemoryMembership, instance: str, *, host: str = "host-a") -> None:
    """Another live process under ``w1``: it registers every :data:`PERIOD` seconds."""
    while True:
        await membership.register(record(instance, membership.clock.now(), host=host), 10.0)
        await membership.clock.sleep(PERIOD)


async def claim(membership: MemoryMembership, host: str = "host-b", *, running: bool = True) -> MemberInfo | None:
    """Claim ``w1`` on ``host``, where the pid of the record's process is ``running`` or not."""
    return await claim_worker_id(membership, "w1", "mine", membership.clock, heartbeat_period=PERIOD, host=host,
                                 exists=lambda pid: running)


async def test_a_worker_id_nobody_runs_under_is_claimed_without_waiting() -> None:
    clock = VirtualClock(START)
    membership = MemoryMembership(clock)
    await membership.register(dataclasses.replace(record("other", START), worker_id="w2"), 10.0)
    assert await claim(membership) is None
    assert clock.now() == START


async def test_a_second_process_under_a_live_worker_id_is_refused_within_one_heartbeat_period() -> None:
    clock = VirtualClock(START)
    membership = MemoryMembership(clock)
    async with clock.autojumping():
        other = asyncio.create_task(heartbeats(membership, "theirs"))
        await clock.sleep(1.0)  # it registered at START, renews at START + 2.5
        with pytest.raises(DuplicateWorkerError) as refused:
            await claim(membership)
        assert START + PERIOD <= clock.now() <= START + PERIOD + CLAIM_POLL
        other.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await other
    assert str(refused.value) == f"worker id 'w1' is in use: pid 41 on host-a is running under it; {FIX}"


async def test_a_crashed_predecessors_record_from_another_host_is_taken_over_after_one_heartbeat_period() -> None:
    clock = VirtualClock(START)
    membership = MemoryMembership(clock)
    crashed = record("theirs", START - 1.0)  # SIGKILLed a second ago: listed for 9 s more
    await membership.register(crashed, 10.0)
    async with clock.autojumping():
        assert await claim(membership, host="host-b") == crashed
    assert clock.now() == pytest.approx(START + PERIOD + RENEWAL_SLACK)


async def test_on_the_same_host_the_wait_ends_when_the_predecessors_renewal_is_overdue() -> None:
    clock = VirtualClock(START)
    membership = MemoryMembership(clock)
    crashed = record("theirs", START - 1.0)
    await membership.register(crashed, 10.0)
    async with clock.autojumping():
        assert await claim(membership, host="host-a") == crashed
    assert clock.now() == pytest.approx(START - 1.0 + PERIOD + RENEWAL_SLACK)


async def test_a_restart_on_the_same_host_where_the_records_pid_is_gone_takes_over_at_once() -> None:
    clock = VirtualClock(START)
    membership = MemoryMembership(clock)
    crashed = record("theirs", START - 0.1)  # SIGKILLed just after a renewal
    await membership.register(crashed, 10.0)
    assert await claim(membership, host="host-a", running=False) == crashed
    assert clock.now() == START


async def test_a_restart_on_the_same_host_after_a_heartbeat_period_takes_over_at_once() -> None:
    clock = VirtualClock(START)
    membership = MemoryMembership(clock)
    crashed = record("theirs", START - PERIOD - RENEWAL_SLACK)
    await membership.register(crashed, 10.0)
    assert await claim(membership, host="host-a") == crashed
    assert clock.now() == START


def test_the_watch_is_bounded_by_one_period_and_the_slack_whatever_the_record_says() -> None:
    def running(pid: int) -> bool:
        return True

    ahead = record("x", START + 50.0)  # its clock ahead of this one
    assert watch_time(ahead, START, PERIOD, "host-a", running) == PERIOD + RENEWAL_SLACK
    assert watch_time(record("x", START), START, PERIOD, "elsewhere", lambda pid: False) == PERIOD + RENEWAL_SLACK
    unnamed = MemberInfo("w1", "digest", {INSTANCE: "x"})  # no period, host or renewal time: this worker's period
    assert watch_time(unnamed, START, 1.0, "host-a", running) == 1.0 + RENEWAL_SLACK


def test_a_record_from_another_process_space_of_this_host_name_is_watched_the_whole_bound() -> None:
    def probed(pid: int) -> bool:
        raise AssertionError("a pid of another pid namespace names no process here: it must not be probed")

    container = record("x", START - 0.1)
    container.details[PROCESS_SPACE] = "boot/4026532179"
    assert watch_time(container, START, PERIOD, "host-a", probed, space="boot/4026531836") == PERIOD + RENEWAL_SLACK
    assert watch_time(container, START, PERIOD, "host-a", lambda pid: False, space="boot/4026532179") == 0.0


def test_the_process_space_is_the_kernels_boot_and_the_pid_namespace() -> None:
    space = process_space()
    assert space is not None
    boot, namespace = space.split("/")
    assert boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert int(namespace) == os.stat("/proc/self/ns/pid").st_ino
    child = subprocess.run([sys.executable, "-c", "from egress.runtime.cluster.duplicates import process_space; "
                            "print(process_space())"], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == space  # another process of this namespace: the same space


def test_a_pid_is_probed_on_this_host() -> None:
    assert process_exists(os.getppid())
    assert not process_exists(os.getpid())  # a record of this pid is a predecessor's: the pid was reused
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()  # reaped: no process of that pid now (until reused)
    assert not process_exists(child.pid)


async def test_a_record_that_goes_away_while_watched_is_claimed_at_once() -> None:
    clock = VirtualClock(START)
    membership = MemoryMembership(clock)
    await membership.register(record("theirs", START), 10.0)
    async with clock.autojumping():
        watching = asyncio.create_task(claim(membership))
        await clock.sleep(1.0)
        await membership.deregister("w1")  # the other process stopped in order
        assert await watching is None
    assert clock.now() <= START + 1.0 + CLAIM_POLL


def test_a_record_another_instance_wrote_is_a_duplicate_and_a_taken_over_one_is_not() -> None:
    me = record("mine", START, started_at=START)
    predecessor = record("theirs", START - 1.0)
    assert duplicate_of([me], me, None) is None
    assert duplicate_of([predecessor], me, renewal(predecessor)) is None  # listed again before it lapsed
    renewed = record("theirs", START + 2.0)
    assert duplicate_of([renewed], me, renewal(predecessor)) == renewed  # it was alive after all
    assert started_before(renewed, me)
    assert not started_before(me, renewed)


def worker(membership: MemoryMembership, instance: str, started_at: float) -> Worker:
    settings = WorkerSettings("w1", "digest", lease_ttl=10.0, heartbeat_period=PERIOD, instance=instance,
                              details={"host": "host-b", "pid": 42, "started_at": started_at})
    return Worker(membership, JobSet(lambda unit: None, Metrics()), [], settings,  # type: ignore[arg-type]
                  membership.clock)


async def test_a_running_worker_leaves_when_an_earlier_process_renews_its_record_and_leaves_it_in_place() -> None:
    clock = VirtualClock(START)
    membership = MemoryMembership(clock)
    late = worker(membership, "late", started_at=START)  # it slipped through: both started at once
    run = asyncio.create_task(late.run())
    await clock.advance(0)
    await membership.register(record("early", clock.now(), started_at=START - 5.0), 10.0)
    await clock.advance(PERIOD)
    with pytest.raises(DuplicateWorkerError, match=rf"^worker id 'w1' is in use: pid 41 on host-a .*; {FIX}$"):
        await run
    assert membership.deregistered == []  # the record is the other process's
    assert (await membership.members())[0].details[INSTANCE] == "early"


async def test_a_running_worker_goes_on_when_the_other_process_started_later(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock(START)
    membership = MemoryMembership(clock)
    early = worker(membership, "early", started_at=START - 5.0)
    run = asyncio.create_task(early.run())
    await clock.advance(0)
    with caplog.at_level(logging.WARNING):
        await membership.register(record("late", clock.now(), started_at=START), 10.0)
        await clock.advance(PERIOD)
    assert not run.done()
    assert "pid 41 on host-a registered under this worker id too; it started later" in caplog.text
    assert (await membership.members())[0].details[INSTANCE] == "early"  # renewed over the other's
    early.request_stop()
    await clock.advance(0)
    await run
    assert membership.deregistered == ["w1"]


async def test_a_running_worker_leaves_at_the_first_listing_between_heartbeats_that_shows_an_earlier_duplicate() \
        -> None:
    """Members listed between heartbeats (here every retry period: an engine without member
    notices) are checked too, so a later duplicate stops within a retry period, not a heartbeat."""
    clock = VirtualClock(START)
    membership = MemoryMembership(clock)
    late = worker(membership, "late", started_at=START)
    run = asyncio.create_task(late.run())
    await clock.advance(0)
    await membership.register(record("early", clock.now(), started_at=START - 5.0), 10.0)
    await clock.advance(late.settings.acquire_retry_period)
    assert late.settings.acquire_retry_period < PERIOD
    assert run.done()
    with pytest.raises(DuplicateWorkerError, match=rf"^worker id 'w1' is in use: pid 41 on host-a .*; {FIX}$"):
        await run
