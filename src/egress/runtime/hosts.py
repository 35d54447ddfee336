"""Where a run's units run: the protocol between ``Pipeline`` and its host.

``Pipeline`` keeps the run's lifecycle (open the engine, check the state directory, set up
throttling, run, close) and hands the units to one of two hosts:

* :class:`~egress.runtime.embedded.EmbeddedHost`: this process takes every unit
  (``Ownership.acquire``) and runs them until they end, a source fails, or, with
  ``until_drained``, everything is delivered.
* :class:`~egress.runtime.cluster.host.ClusterHost`: this process is one worker of a cluster and
  runs its share of the units, shared with the engine's other live members through leases
  (``egress.runtime.cluster``).

While the engine is open the Pipeline calls :meth:`Host.join` (before the layout check),
:meth:`Host.elected_throttling`, :meth:`Host.run`, then :meth:`Host.close`; the status view asks
:meth:`Host.source_finished` and :meth:`Host.describe` at any time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from egress.clock import Clock
from egress.engines import Engine, LeaseInfo, MemberInfo
from egress.runtime.jobs import JobSet
from egress.runtime.options import RunOptions
from egress.runtime.plan import Plan
from egress.runtime.unit import Unit
from egress.spec import DynamicSpec

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from egress.throttler import Throttling


@dataclass
class RunResult:
    """How a run ended: ``drained`` (all delivered), ``blocked`` (terminal sink errors, one line
    each), ``unreachable`` (committed work no job of the Spec handles, one line per place; found
    by the drained check), ``error`` (a failure that stopped the run), ``elapsed`` seconds."""

    drained: bool = False
    blocked: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    error: BaseException | None = None
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.blocked and not self.unreachable


def plan_units(plan: Plan) -> list[Unit]:
    """Every unit of ``plan``'s Spec: each source's reader partitions, then each computation's partitions."""
    units = [Unit.source(source_id, k) for source_id, source in plan.sources.items() for k in range(source.readers)]
    units += [Unit.computation(cid, p) for cid in plan.computations for p in range(plan.spec.partition_count)]
    return units


@dataclass(frozen=True)
class HostContext:
    """What a host runs with: the ``plan`` (its Spec's units and streams: a DynamicSpec reload
    changes neither), this process's ``units``, the run's ``options`` and ``clock``; ``stop``, the
    run's stop event (set: every unit stops, a job after its function's call in hand), and ``stop_run``, which asks
    the whole run to stop (``Pipeline.request_stop``)."""

    plan: Plan
    units: JobSet
    options: RunOptions
    clock: Clock
    stop: asyncio.Event
    stop_run: Callable[[], None]


class WorkerView(Protocol):
    """A cluster worker as its run shows it: the live ``members`` it last listed, and the units it
    ``taken`` and ``lost``, each with when (``clock.now()``)."""

    @property
    def members(self) -> list[MemberInfo]: ...

    @property
    def taken(self) -> list[tuple[Unit, float]]: ...

    @property
    def lost(self) -> list[tuple[Unit, float]]: ...


class Host(Protocol):
    """Runs a pipeline's units on an open engine, and tells where they run."""

    @property
    def shared(self) -> bool:
        """Whether other processes run some of the units (a cluster): a source's reader records
        its end in the engine for them, and a unit not running here may run elsewhere."""
        ...

    @property
    def worker(self) -> WorkerView | None:
        """This process's cluster worker while it runs (its members, the units it took and lost);
        ``None`` for an embedded run, and before and after a cluster run."""
        ...

    async def join(self, engine: Engine, started_at: float) -> None:
        """Before the layout check (which may record this Spec's additions): a cluster worker
        that started at ``started_at`` (``clock.now()``) raises
        :class:`~egress.runtime.cluster.worker.ClusterSpecError` when the live members run
        another Spec, and :class:`~egress.runtime.cluster.duplicates.DuplicateWorkerError` when
        another live process runs under its worker id."""
        ...

    def elected_throttling(self, engine: Engine, dynamic: DynamicSpec, *, file: str | None,
                           registry: CollectorRegistry | None) -> Throttling | None:
        """The throttling of a cluster whose workers elect the throttler controller among
        themselves (:mod:`egress.runtime.cluster.throttler_role`), or ``None``: the Pipeline's own."""
        ...

    async def run(self, engine: Engine, result: RunResult) -> None:
        """Run the units until the run stops; record in ``result`` how it ended (``error``,
        ``drained``, ``unreachable``)."""
        ...

    def request_stop(self) -> None:
        """Stop after every unit's current epoch (the Pipeline has stopped the units)."""
        ...

    async def close(self) -> None:
        """Give up what :meth:`elected_throttling` took (after :meth:`run`, also a failed one)."""
        ...

    async def source_finished(self, engine: Engine, source_id: str, leases: list[LeaseInfo]) -> bool:
        """Whether source ``source_id`` was read to its end by another process (its reader here
        says so itself); ``leases`` are the engine's live ones."""
        ...

    async def describe(self, engine: Engine | None, leases: list[LeaseInfo]) -> dict[str, Any]:
        """``/status``'s ``worker`` (this process's name in its cluster, ``None`` embedded),
        ``members`` (the cluster's live members, each ``{"worker_id", **details}``; ``[]`` while
        the ``engine`` is not open) and
        ``throttler`` (the elected controller's state, ``None`` without an election)."""
        ...
