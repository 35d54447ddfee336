"""A cluster worker: one of several processes that share a pipeline through one engine.

Every ``heartbeat_period`` seconds the worker registers itself (a member for ``lease_ttl``
seconds), renews the lease of every unit it runs and lists the live members; it lists them again
between heartbeats when the engine tells of a new member or a departure (``MemberNotices``, NATS),
and every ``acquire_retry_period`` seconds while units move (a unit to take or hand over, a lease
lost) or on an engine without notices. From the members it computes by rendezvous hashing
(``egress.runtime.cluster.assignment``) the
units it should run: it takes the ones it should run and does not (``try_acquire``; a unit whose
lease another worker still holds is tried again every ``acquire_retry_period``, until that worker hands it over),
and hands over the ones it runs and should not: the job finishes its epoch and commits, then the lease is released so
the new owner can take it at once. A renewal that returns ``False`` or a commit that raises
``FencedError`` means the unit's lease was lost: that job stops, and the worker goes on. A job
that meets ``EngineUnavailableError`` (the engine's server unreachable for its outage timeout)
stops alone too, and the unit is taken again once the server answers; only a heartbeat whose
membership renewal meets it ends the worker.

Failover: a worker that stops renewing (killed, paused, cut off) keeps its leases at most
``lease_ttl`` seconds and stays listed as long; the others see it gone at their next heartbeat,
and take its units at the heartbeat after the lease lapsed; its jobs' last uncommitted epoch is
replayed. So a dead worker's units run again within ``lease_ttl + heartbeat_period`` plus one
epoch (defaults: 10 s + 2.5 s). A worker cut off without noticing (a frozen server, a blackhole)
holds the sinks of each job whose lease lapsed by its own clock (``egress.runtime.holds``), so it
delivers nothing that the next owner would send again; a renewal within the TTL resumes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import orjson

from egress.clock import Clock, event_or_timeout
from egress.engines import Engine, EngineUnavailableError, FencedError, MemberInfo, MemberNotices
from egress.errors import SpecError
from egress.runtime.cluster.assignment import assign, changes, units_of
from egress.runtime.cluster.duplicates import (
    HEARTBEAT_PERIOD,
    INSTANCE,
    RENEWED_AT,
    DuplicateWorkerError,
    duplicate_error,
    duplicate_of,
    new_instance,
    process_of,
    started_before,
)
from egress.runtime.holds import LEASE, LeaseDeadlines
from egress.runtime.jobs import JobSet
from egress.runtime.unit import Unit
from egress.spec import Spec

logger = logging.getLogger(__name__)


def spec_digest(spec: Spec) -> str:
    """The hex BLAKE2b digest of the Spec as loaded (the same in YSON, YAML or JSON, whatever the
    key order): the workers of one cluster compare it."""
    text = orjson.dumps(spec.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def default_worker_id() -> str:
    """``<hostname>-<pid>``: unique on a machine, readable in ``/status``."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerSettings:
    """``worker_id`` names this worker in the cluster; ``spec_digest`` the Spec it runs (the
    others must run the same); ``lease_ttl`` (seconds) how long a lease and a membership last
    without renewal; ``heartbeat_period`` (seconds) how often both are renewed;
    ``acquire_retry_period`` (seconds) how often, while units move (or on an engine without member
    notices), the members are listed and a wanted unit still held elsewhere is tried;
    ``spec_file`` names the Spec in errors; ``details`` what ``/status`` shows of this worker;
    ``handover_timeout`` (seconds) how long a job handed over to another worker waits for its
    sinks' messages in flight to be acknowledged before its last commit (the lease is renewed
    meanwhile), so that the new owner sends none of them again; ``instance`` this process's
    token in its membership record, and ``taken_over`` the :func:`~egress.runtime.cluster.duplicates.renewal`
    of a crashed predecessor's record under this id that this worker took over (listed again
    before it lapses, it is no live duplicate); see ``egress.runtime.cluster.duplicates``."""

    worker_id: str
    spec_digest: str
    lease_ttl: float = 10.0
    heartbeat_period: float = 2.5
    acquire_retry_period: float = 0.5
    spec_file: str | None = None
    details: dict[str, object] = field(default_factory=dict)
    handover_timeout: float = 5.0
    instance: str = field(default_factory=new_instance)
    taken_over: tuple[Any, Any] | None = None


class ClusterSpecError(SpecError):
    """A worker was started with another Spec than the live members of its cluster run."""


async def refuse_another_spec(engine: Engine, digest: str, worker_id: str, spec_file: str | None,
                              started_at: float) -> None:
    """Raise :class:`ClusterSpecError` (naming ``spec_file``) when a live member of ``engine``'s
    pipeline that started before this worker (``started_at``, then the worker id, decide) runs a
    Spec whose digest is not ``digest``; of two workers with different Specs exactly one leaves."""
    refuse_joined_later(await engine.members(), digest, worker_id, spec_file, started_at)


def refuse_joined_later(members: list[MemberInfo], digest: str, worker_id: str, spec_file: str | None,
                        started_at: float) -> None:
    """:func:`refuse_another_spec` on a list of ``members``."""
    for member in members:
        if member.spec_digest == digest or member.worker_id == worker_id:
            continue
        if (float(member.details.get("started_at", 0.0)), member.worker_id) < (started_at, worker_id):
            raise _another_spec(member, digest, spec_file)


def _another_spec(member: MemberInfo, digest: str, spec_file: str | None) -> ClusterSpecError:
    return ClusterSpecError(
        f"worker {member.worker_id} of this pipeline's cluster runs another Spec (digest {member.spec_digest[:12]}, "
        f"this one {digest[:12]}): every worker of a pipeline must run the same Spec. Start this worker with the "
        "Spec file the others use, or stop every worker first and start them all with the new Spec (its layout is "
        "then checked against the committed data)", file=spec_file)


class Worker:
    """Runs this process's share of ``units`` (every unit of the Spec) in ``jobs`` on ``engine``.

    :meth:`run` returns once :meth:`request_stop` was called and every job committed its last
    epoch and released its lease; it raises :class:`ClusterSpecError` when the live members run
    another Spec, :class:`~egress.runtime.cluster.duplicates.DuplicateWorkerError` when another
    process that started earlier runs under its worker id, and what a job raised other than
    ``FencedError`` (a failure of the pipeline).
    """

    def __init__(self, engine: Engine, jobs: JobSet, units: list[Unit], settings: WorkerSettings,
                 clock: Clock) -> None:
        self._engine = engine
        self._clock = clock
        self._jobs = jobs
        self._units = units
        self.settings = settings
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self._handovers: dict[Unit, asyncio.Task[None]] = {}
        self._losing: set[Unit] = set()
        self._failure: BaseException | None = None  # what a job raised while being handed over
        self._deadlines = LeaseDeadlines(settings.lease_ttl)
        self.members: list[MemberInfo] = []
        # On an engine with member notices, the members are listed between heartbeats only when a
        # notice told of a new member or a departure, or while units move (see _settled).
        self._noticed = isinstance(engine, MemberNotices)
        self._members_stale = True
        self.lost: list[tuple[Unit, float]] = []  # units whose lease was lost, and when (clock.now())
        self.taken: list[tuple[Unit, float]] = []  # units taken, and when (clock.now())
        self._duplicates_seen: set[object] = set()  # instance tokens of later duplicates, warned of once
        self._refused = False  # a duplicate of an earlier process: its record is that process's, not deleted

    def request_stop(self) -> None:
        self._stop.set()
        self._changed.set()

    def notice(self) -> None:
        """Look again now (a job ended)."""
        self._changed.set()

    @property
    def _started_at(self) -> float:
        return float(self.settings.details.get("started_at", 0.0))  # type: ignore[arg-type]

    @property
    def me(self) -> MemberInfo:
        """This worker's membership record as of now (``renewed_at``: ``clock.now()``)."""
        settings = self.settings
        return MemberInfo(settings.worker_id, settings.spec_digest,
                          {**settings.details, INSTANCE: settings.instance,
                           HEARTBEAT_PERIOD: settings.heartbeat_period, RENEWED_AT: self._clock.now()})

    def member_noticed(self, worker_id: str | None) -> None:
        """The engine told of a registration of ``worker_id`` (``None``: a departure): list the
        members now unless it is one of them already (a heartbeat)."""
        if worker_id is None or all(member.worker_id != worker_id for member in self.members):
            self._members_stale = True
            self._changed.set()

    async def run(self) -> None:
        if isinstance(self._engine, MemberNotices):
            self._engine.on_members(self.member_noticed)
        await self._join()
        watch = asyncio.create_task(self._hold_lapsed_leases())
        try:
            await self._loop()
        finally:
            await self._leave()
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def _hold_lapsed_leases(self) -> None:
        """Hold the sinks of every job whose lease lapsed by this worker's clock (``lease_ttl``
        after the last take or renewal sent that succeeded), also while the engine answers nothing
        (a frozen server keeps the heartbeat waiting): another worker may run the partition now,
        and what the job delivered from then on would be sent again. A renewal resumes them."""
        clock = self._clock
        while True:
            now = clock.monotonic()
            jobs = self._jobs.jobs_by_unit()
            for unit in self._deadlines.lapsed(jobs, now):
                job = jobs[unit]
                if LEASE not in job.holds.causes:
                    logger.warning("%s partition %d: its lease lapsed by this worker's clock (no renewal for %g s); "
                                   "its sinks start no delivery until it is renewed", unit.consumer, unit.partition,
                                   self.settings.lease_ttl)
                    job.lease_lapsed(True)
            await clock.sleep(self._deadlines.next_lapse(jobs, now))

    async def _join(self) -> None:
        """Refuse to join members that run another Spec (checked before anything, by the runner,
        and again here), then register."""
        await refuse_another_spec(self._engine, self.settings.spec_digest, self.settings.worker_id,
                                  self.settings.spec_file, self._started_at)
        await self._engine.register(self.me, self.settings.lease_ttl)

    async def _loop(self) -> None:
        clock = self._clock
        next_heartbeat = clock.monotonic()
        while not self._stop.is_set():
            # Cleared before the pass, not before the wait: what a notice or a job's end set while
            # the pass ran ends the wait at once (the pass may have looked before it came).
            self._changed.clear()
            self._collect_ended()
            self._refuse_if_joined_later()
            try:
                if clock.monotonic() >= next_heartbeat:
                    # Registrations a heartbeat period apart, however long the renewals take (a
                    # starting worker under this id waits that long for one: egress.runtime.cluster.duplicates);
                    # after a heartbeat longer than that (the engine slow to answer), a period from its end.
                    beat = clock.monotonic()
                    await self._heartbeat()
                    next_heartbeat = beat + self.settings.heartbeat_period
                    if next_heartbeat <= clock.monotonic():
                        next_heartbeat = clock.monotonic() + self.settings.heartbeat_period
                elif self._members_stale or not self._noticed or not self._settled():
                    # A joiner is seen at once (its notice) or within a retry period, not a heartbeat.
                    self._members_stale = False
                    self.members = await self._engine.members()
                    # A duplicate under this id takes this worker's leases at each pass, not at each
                    # heartbeat: the later of the two leaves at the first listing that shows it.
                    self._refuse_a_duplicate()
                await self._reconcile()
            except (MembershipLostError, DuplicateWorkerError):
                raise
            except Exception as error:  # the engine unreachable for a moment: its leases may still hold
                logger.warning("worker %s: the engine failed (%s: %s); trying again", self.settings.worker_id,
                               type(error).__name__, error)
                next_heartbeat = min(next_heartbeat, clock.monotonic() + self.settings.acquire_retry_period)
            until_heartbeat = next_heartbeat - clock.monotonic()
            if self._noticed and self._settled():  # nothing to retry: a notice or the heartbeat wakes it
                await self._wait(max(0.0, until_heartbeat))
            else:
                await self._wait(max(0.0, min(until_heartbeat, self.settings.acquire_retry_period)))

    def _settled(self) -> bool:
        """Whether this worker runs exactly the units it should among the members it knows, with
        no hand-over or lost lease pending: then nothing needs a retry before the next heartbeat."""
        return not self._handovers and not self._losing and self.desired() == set(self._jobs.running)

    def _refuse_if_joined_later(self) -> None:
        """Leave with :class:`ClusterSpecError` when a member that runs another Spec started before
        this one (it joined while this worker's membership had lapsed, or both joined at once)."""
        refuse_joined_later(self.members, self.settings.spec_digest, self.settings.worker_id, self.settings.spec_file,
                            self._started_at)

    async def _wait(self, seconds: float) -> None:
        """Until a job ends, a stop is asked for, a member notice, or ``seconds`` on the clock
        (cleared at the start of each pass of :meth:`_loop`)."""
        await event_or_timeout(self._changed, self._clock, seconds)

    async def _register(self) -> None:
        """Stay listed; a registration that met :class:`EngineUnavailableError` (the engine's
        server unreachable for its whole outage timeout) ends the worker: its membership and leases
        have lapsed for the others."""
        try:
            await self._engine.register(self.me, self.settings.lease_ttl)
        except EngineUnavailableError as error:
            raise MembershipLostError(f"worker {self.settings.worker_id}: its membership could not be renewed: "
                                  f"{error}") from error

    async def _heartbeat(self) -> None:
        """Learn the members (and whether another process wrote this worker's record since its
        last registration), register, and keep the leases of the running units."""
        self._members_stale = False
        self.members = await self._engine.members()
        self._refuse_a_duplicate()
        await self._register()
        for unit, running in list(self._jobs.running.items()):
            if unit in self._losing:
                continue
            sent = self._clock.monotonic()
            renewed = await self._engine.renew(unit.consumer, unit.partition, running.generation,
                                               self.settings.lease_ttl)
            if renewed and self._jobs.running.get(unit) is running:
                self._renewed(unit, sent)
            if not renewed and self._jobs.running.get(unit) is running and unit not in self._handovers:
                # (a unit handed over is released meanwhile)
                self._lose(unit, "its lease was not renewed in time and another worker may hold it")

    def _refuse_a_duplicate(self) -> None:
        """Leave with :class:`DuplicateWorkerError` when another live process under this worker id
        that started earlier wrote its record since this one's last registration; one that started
        later is warned of (it leaves at its own next heartbeat)."""
        me = self.me
        other = duplicate_of(self.members, me, self.settings.taken_over)
        if other is None:
            return
        if started_before(other, me):
            self._refused = True
            raise duplicate_error(self.settings.worker_id, other)
        if other.details.get(INSTANCE) not in self._duplicates_seen:
            self._duplicates_seen.add(other.details.get(INSTANCE))
            logger.warning("worker %s: %s registered under this worker id too; it started later, so it leaves "
                           "and this one goes on", self.settings.worker_id, process_of(other))

    def _renewed(self, unit: Unit, sent_at: float) -> None:
        """``unit``'s lease was renewed by a request sent at ``sent_at``: its job's sinks deliver
        again, unless the renewal lapsed already by this worker's clock (answered ``lease_ttl``
        or more after it was sent, it proves nothing about now: the next renewal decides)."""
        self._deadlines.renewed(unit, sent_at)
        job = self._jobs.jobs_by_unit().get(unit)
        if job is not None and LEASE in job.holds.causes \
                and not self._deadlines.lapsed([unit], self._clock.monotonic()):
            logger.warning("%s partition %d: its lease was renewed; its sinks deliver again",
                           unit.consumer, unit.partition)
            job.lease_lapsed(False)

    def desired(self) -> set[Unit]:
        """The units this worker should run among the live members (itself included)."""
        names = {m.worker_id for m in self.members} | {self.settings.worker_id}
        return units_of(assign(self._units, names), self.settings.worker_id)

    async def _reconcile(self) -> None:
        """Take and hand over units (a wanted unit another worker still holds is tried next time)."""
        step = changes(self.desired(), set(self._jobs.running), set(self._handovers) | self._losing)
        for unit in step.hand_over:
            self._handovers[unit] = asyncio.create_task(self._hand_over(unit, self.settings.handover_timeout))
        for unit in sorted(step.take):
            sent = self._clock.monotonic()
            generation = await self._engine.try_acquire(unit.consumer, unit.partition, self.settings.worker_id,
                                                        self.settings.lease_ttl)
            if generation is not None:
                self._deadlines.renewed(unit, sent)
                self._jobs.start(unit, generation)
                self.taken.append((unit, self._clock.now()))

    async def _hand_over(self, unit: Unit, acknowledgements_within: float = 0.0) -> None:
        """Finish the unit's epoch (after waiting up to ``acknowledgements_within`` seconds for its
        sinks' messages in flight) and commit, then release its lease (a lost lease: nothing to
        release; a release that fails: the lease lapses after its TTL instead)."""
        generation = self._jobs.running[unit].generation
        error = await self._jobs.stop(unit, acknowledgements_within=acknowledgements_within)
        try:
            if error is None:
                await self._engine.release(unit.consumer, unit.partition, generation)
            elif not isinstance(error, FencedError | EngineUnavailableError) and self._failure is None:
                self._failure = error
        except Exception as failed:
            logger.warning("%s partition %d: release failed (%s); the lease lapses in %s s",
                           unit.consumer, unit.partition, failed, self.settings.lease_ttl)
        finally:
            self._handovers.pop(unit, None)
            self.notice()

    def _collect_ended(self) -> None:
        """Forget units whose job ended after losing its lease; raise a failure of the pipeline."""
        if self._failure is not None:
            raise self._failure
        for unit, error in self._jobs.ended().items():
            if unit in self._handovers:
                continue
            if isinstance(error, FencedError | EngineUnavailableError) and unit not in self._losing:
                self._lose(unit, str(error))
            if unit in self._losing:
                self._losing.discard(unit)
                self._jobs.forget(unit)
            elif error is not None:
                raise error
            # A source reader that read its source to the end returned: it keeps its lease, the unit is done.

    def _lose(self, unit: Unit, why: str) -> None:
        # Taken again at the next reconcile (try_acquire gives this worker its own lease back).
        """Stop the job of a unit whose lease is lost (its commits are fenced); it is forgotten once it ends."""
        logger.warning("%s partition %d: lease lost (%s); its job stops, the worker goes on",
                           unit.consumer, unit.partition, why)
        self._jobs.ask_to_stop(unit)
        self._losing.add(unit)
        self.lost.append((unit, self._clock.now()))
        self._members_stale = True  # taken by a new member, or by a duplicate under this id: look now
        self._changed.set()

    async def _leave(self) -> None:
        """Stop every job (each commits its last epoch), release their leases, deregister."""
        for unit in list(self._jobs.running):
            if unit not in self._handovers and unit not in self._losing:
                self._handovers[unit] = asyncio.create_task(self._hand_over(unit))
        await asyncio.gather(*self._handovers.values(), *(r.task for r in self._jobs.running.values()),
                             return_exceptions=True)
        if not self._refused:
            with contextlib.suppress(Exception):
                await self._engine.deregister(self.settings.worker_id)
        if self._failure is not None:
            raise self._failure


class MembershipLostError(EngineUnavailableError):
    """The worker could not renew its membership within the engine's outage timeout: it ends."""
