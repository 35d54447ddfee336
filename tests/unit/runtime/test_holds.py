"""When a partition job's sinks start no new delivery, on the virtual clock with exact times.

A real :class:`PartitionJob` (and a real :class:`Worker` around it) over an engine in memory that
can stop answering some requests, without failing them (a frozen or blackholed server), and a real
async HTTP sink whose transport answers each POST after a fixed latency:

* commit backpressure: while a commit does not complete, the sink finishes the deliveries in
  flight, and once they acknowledged beyond what the commit carries it starts no new one; the
  commit completing resumes it;
* lease lapse: when renewals stop completing, the sink starts no delivery from the moment the
  worker's clock says the lease lapsed (last renewal sent + TTL), also while commits still
  complete; a renewal sent and answered within its TTL resumes it, one answered later does not.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from egress.clock import VirtualClock
from egress.connectors.base import SinkContext
from egress.connectors.sinks.async_http import AsyncHttpSink
from egress.engines import Checkpoint, EpochCommit, KeyedState, LogMessage, MemberInfo, SinkProgress
from egress.keys import encode_key
from egress.observe import Metrics, StatusTree
from egress.runtime import RunOptions, load_plan
from egress.runtime.cluster.worker import Worker, WorkerSettings
from egress.runtime.holds import COMMIT, LEASE, LeaseDeadlines
from egress.runtime.jobs import JobSet
from egress.runtime.partition_job import PartitionJob
from egress.runtime.unit import Unit
from tests.conftest import payload_spec
from tests.unit.connectors.sinks.test_async_http_delivery import Outcome, ScriptedTransport

LATENCY = 0.7  # seconds per POST: never on a whole second, where leases lapse and heartbeats come
MESSAGES = 40
WINDOW = 4  # deliveries started at once: one connection, the sink's send window per connection
TTL = 4.0
HEARTBEAT = 1.0
UNIT = Unit.computation("deliver", 0)


class Gate:
    """Requests that wait while closed, as on a server that answers nothing but keeps the connection."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def passed(self) -> None:
        await self._open.wait()


@dataclasses.dataclass
class MemoryEngine:
    """The few engine operations a worker and a partition job of ``deliver`` use, in memory; commits
    and renewals wait at their gates."""

    log: list[LogMessage]
    commits: list[EpochCommit] = dataclasses.field(default_factory=list)
    commit_gate: Gate = dataclasses.field(default_factory=Gate)
    renew_gate: Gate = dataclasses.field(default_factory=Gate)
    renewals: list[float] = dataclasses.field(default_factory=list)
    clock: VirtualClock | None = None

    async def load_checkpoint(self, consumer: str, partition: int, sinks: list[str]) -> Checkpoint:
        return Checkpoint({}, {sink: SinkProgress() for sink in sinks}, [], 1)

    async def load_keyed_state(self, consumer: str, partition: int, partition_count: int,
                               external: list[str]) -> KeyedState:
        return KeyedState({}, {}, [], None)

    async def read(self, stream: str, partition: int, after: int, limit: int) -> list[LogMessage]:
        return self.log[after:after + limit]

    async def commit(self, commit: EpochCommit) -> None:
        await self.commit_gate.passed()
        self.commits.append(commit)

    async def members(self) -> list[MemberInfo]:
        return []

    async def register(self, member: MemberInfo, ttl: float) -> None:
        pass

    async def deregister(self, worker_id: str) -> None:
        pass

    async def try_acquire(self, consumer: str, partition: int, owner: str, ttl: float) -> int:
        return 1

    async def renew(self, consumer: str, partition: int, generation: int, ttl: float) -> bool:
        await self.renew_gate.passed()
        assert self.clock is not None
        self.renewals.append(self.clock.monotonic())
        return True

    async def release(self, consumer: str, partition: int, generation: int) -> None:
        pass


class Setup:
    """A partition job of ``deliver`` over :class:`MemoryEngine` whose sink POSTs through a
    :class:`ScriptedTransport` answering 200 after :data:`LATENCY`."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = VirtualClock()
        spec, dynamic = payload_spec(tmp_path, "http://receiver.test/events", [f"p{i}" for i in range(MESSAGES)],
                                     sink_parameters={"max_idle_connections": 1})
        plan = load_plan(spec, dynamic)
        self.transport = ScriptedTransport(self.clock, lambda request, n: Outcome(200, latency=LATENCY))
        transport = self.transport

        class ScriptedSink:
            @classmethod
            def create(cls, context: SinkContext, parameters: Any, dynamic: Any, progress: SinkProgress) -> Any:
                return AsyncHttpSink(context, parameters, dynamic, progress,
                                     transport_factory=lambda scheme, parameters: transport)

        computation = plan.computations["deliver"]
        sink = dataclasses.replace(computation.sinks["http"], sink_class=ScriptedSink)
        self.computation = dataclasses.replace(computation, sinks={"http": sink})
        self.streams = plan.spec.streams
        log = [LogMessage("events", 0, i, f"m{i}".encode(), encode_key([i]), None, {"id": i, "payload": f"p{i}"})
               for i in range(MESSAGES)]
        self.engine = MemoryEngine(log, clock=self.clock)
        self.metrics = Metrics()

    def job(self, unit: Unit = UNIT) -> PartitionJob:
        return PartitionJob(self.computation, unit.partition, streams=self.streams, partition_count=1,
                            engine=self.engine, clock=self.clock, metrics=self.metrics,  # type: ignore[arg-type]
                            status=StatusTree(), options=RunOptions(), notify_downstream=lambda slots: None)

    def posts(self, after: float = -1.0, before: float = float("inf")) -> list[float]:
        return [round(t, 6) for t in self.transport.times() if after < t < before]


async def test_a_commit_that_does_not_complete_holds_new_deliveries_until_it_completes(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    job = setup.job()
    run = asyncio.create_task(job.run(generation=1))
    await setup.clock.advance(0)  # the first epoch commits the outbox: the sink starts its window
    assert len(setup.engine.commits) == 1
    assert setup.posts() == [0.0] * WINDOW
    setup.engine.commit_gate.close()  # from now on no commit completes
    await setup.clock.advance(10)
    # At 0.7 the window's acknowledgements start four more and the next epoch's commit (of those
    # four acknowledgements) waits; at 1.4 the sink acknowledged beyond that commit: it holds.
    assert setup.posts() == [0.0] * WINDOW + [LATENCY] * WINDOW
    assert job.holds.causes == {COMMIT}
    assert job.sinks["http"].in_flight == 0
    setup.engine.commit_gate.open()
    await setup.clock.advance(0)  # the commit completes: the sink resumes at once
    assert setup.posts(after=9.0) == [10.0] * WINDOW
    assert job.holds.causes == set()
    assert setup.engine.commits[-1].sink_progress["http"].max_persisted_seq_no == WINDOW  # the one that waited
    await setup.clock.advance(0.1)  # and the next epoch commits what the sink acknowledged meanwhile
    assert setup.engine.commits[-1].sink_progress["http"].max_persisted_seq_no == 2 * WINDOW
    job.stop()
    await setup.clock.advance(1)
    await run


async def test_a_lapsed_lease_holds_the_sinks_until_a_renewal_within_its_ttl(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    clock = setup.clock
    jobs = JobSet(lambda unit: setup.job(unit), setup.metrics)
    worker = Worker(setup.engine, jobs, [UNIT], WorkerSettings("w1", "digest", lease_ttl=TTL,  # type: ignore[arg-type]
                                                                heartbeat_period=HEARTBEAT), clock)
    run = asyncio.create_task(worker.run())
    await clock.advance(2.5)  # taken at 0, renewed at 1 and 2: the lease lasts until 6 by this clock
    assert setup.engine.renewals == [1.0, 2.0]
    setup.engine.renew_gate.close()  # the renewal sent at 3 gets no answer; commits go on
    await clock.advance(3.4)
    job = jobs.running[UNIT].runner
    assert isinstance(job, PartitionJob)
    assert job.holds.causes == set()  # at 5.9 the lease still holds
    await clock.advance(0.2)
    assert job.holds.causes == {LEASE}  # at 6 it lapsed: nothing starts from then on
    started = len(setup.posts())
    await clock.advance(2.0)
    assert len(setup.posts()) == started
    assert setup.posts(after=6.0) == []
    setup.engine.renew_gate.open()  # at 8.1 the renewal sent at 3 is answered: it lapsed at 7, so no resume
    await clock.advance(0)
    assert setup.engine.renewals[-1] == pytest.approx(8.1)
    assert job.holds.causes == {LEASE}
    await clock.advance(1.0)  # the next renewal, sent at 9.1 and answered at once, resumes the sink
    assert setup.engine.renewals[-1] == pytest.approx(9.1)
    assert job.holds.causes == set()
    assert setup.posts(after=6.0)[0] == pytest.approx(9.1)
    worker.request_stop()
    async with clock.autojumping():
        await run


def test_a_lease_lapses_ttl_after_its_last_successful_renewal_was_sent() -> None:
    deadlines = LeaseDeadlines(ttl=4.0)
    deadlines.renewed(UNIT, 1.0)
    deadlines.renewed(UNIT, 0.5)  # an earlier request answered later moves nothing back
    assert deadlines.lapsed([UNIT], 4.99) == []
    assert deadlines.lapsed([UNIT], 5.0) == [UNIT]
    assert deadlines.next_lapse([UNIT], 2.0) == 3.0
    assert deadlines.next_lapse([UNIT], 6.0) == 4.0  # none ahead: a lease taken from now on lasts the TTL
