"""Whether a cluster's whole pipeline is drained, as any worker can tell from the engine alone.

One process's jobs know only their own work; a cluster's ``--until-drained`` ends every worker once
the pipeline has nothing left anywhere: every source read to the end by each of its readers (reader
partition ``k`` sets ``source_finished.<id>``, ``source_finished#<k>.<id>`` for k > 0, in the
engine's metadata to the generation of its lease; a flag of an older lease does not count, so a
reader that starts again must finish again), and the committed inventory shows no log message
unread by a computation, no outbox message unacknowledged and no pending timer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Set

from egress.engines import CommittedInventory, LeaseInfo
from egress.runtime.plan import Plan
from egress.runtime.unit import Unit


def source_is_finished(flag: str | None, source_unit: Unit, leases: list[LeaseInfo]) -> bool:
    """Whether reader ``source_unit`` read its share of the source to the end under its live lease:
    ``flag`` is its ``source_finished`` metadata (``source_reader.finished_key``: the generation that
    set it)."""
    generations = {(lease.consumer, lease.partition): lease.generation for lease in leases}
    generation = generations.get(source_unit.key)
    return flag is not None and generation is not None and flag == str(generation)


class FinishedFlags:
    """The ``source_finished`` flags a worker's drained watch has read set, by reader unit. A set
    flag changes only when a reader under a later lease finishes again, so :meth:`all_finished`
    reads each flag once per lease, not at every check (a watch every half second per worker,
    from the first reader done to the drained end, read every reader's flag each time)."""

    def __init__(self) -> None:
        self._known: dict[Unit, str] = {}

    async def all_finished(self, readers: Iterable[Unit], read_flag: Callable[[Unit], Awaitable[str | None]],
                           leases: Callable[[], Awaitable[list[LeaseInfo]]],
                           reading_here: Set[Unit] = frozenset()) -> bool:
        """Whether every one of ``readers`` read its share to the end under its live lease
        (:func:`source_is_finished`). ``False`` at once, reading nothing, while one of them is in
        ``reading_here`` (readers this worker runs and that have not finished: their flag is unset,
        so a worker running a reader of a live source never asks). The flags not known set are
        read next (``read_flag``), stopping at the first unset; the leases (``leases()``) only once
        every reader has one, so an unfinished source costs no listing of the leases. A known flag
        its reader's live lease does not match is forgotten: read again at the next call."""
        readers = list(readers)
        if not reading_here.isdisjoint(readers):
            return False
        known = self._known
        for unit in readers:
            if unit in known:
                continue
            flag = await read_flag(unit)
            if flag is None:
                return False
            known[unit] = flag
        live = await leases()
        stale = [unit for unit, flag in known.items() if not source_is_finished(flag, unit, live)]
        for unit in stale:
            del known[unit]
        return not stale


def outstanding_work(inventory: CommittedInventory, plan: Plan,
                     blocked: Set[tuple[str, int]] = frozenset()) -> list[str]:
    """Committed work of ``plan`` not yet done, one line per place (empty: drained): log messages a
    computation has not read, outbox messages not acknowledged by every sink (except those of
    ``blocked`` ``(computation, partition)`` jobs, whose sink failed for good), pending timers."""
    readers: dict[str, int] = {}  # by log stream: a stream's lanes (egress.runtime.lanes)
    for computation in plan.computations.values():
        for lane in computation.input_lanes:
            readers[lane] = readers.get(lane, 0) + 1
    unread: dict[tuple[str, int], int] = {}  # by stream, its lanes summed
    for (lane, partition), end in sorted(inventory.log_ends.items()):
        count = readers.get(lane, 0)
        if not count or partition >= plan.spec.partition_count:
            continue  # out of the Spec's reach: the unreachable check's business
        positions = inventory.read_positions.get((lane, partition), [])
        behind = sum(end - p for p in positions) + end * max(0, count - len(positions))
        if behind > 0:
            slot = (plan.stream_of(lane), partition)
            unread[slot] = unread.get(slot, 0) + behind
    lines = [f"stream {stream} partition {partition}: {behind:,} messages not yet read"
             for (stream, partition), behind in sorted(unread.items())]
    for (computation_id, partition, stream), count in sorted(inventory.outbox.items()):
        if count and (computation_id, partition) not in blocked:
            lines.append(f"computation {computation_id} partition {partition}: {count:,} messages of {stream} "
                         "not yet acknowledged")
    for (computation_id, partition), count in sorted(inventory.timers.items()):
        if count:
            lines.append(f"computation {computation_id} partition {partition}: {count:,} pending timers")
    return lines
