"""The embedded log does not grow without bound: consumed messages are trimmed while a run goes on.

Every message a source or computation appends to the log stays until every computation that reads
its stream has committed a position past it; then the engine's
:meth:`~egress.engines.LogRetention.trim_log` deletes it (an engine with that capability:
SQLite), but for the last ``RunOptions.log_retention`` messages of each log partition (kept for
replay). Acknowledged outbox messages are already deleted by the commit that acknowledges them.
The SQLite pages freed are reused by later commits, so a long run's state directory stays at the
size its unconsumed backlog needs. A computation added to the Spec later starts from the oldest
message still kept.

The workers of ``egress run --processes N`` share one SQLite database: there the worker running
:func:`trimming_unit` (one lease, so one worker at a time) trims every stream
(``egress.runtime.cluster.host``). That is safe for the
readers in the other processes because a trim is decided inside the database from the positions
every reader has *committed*: a reader's next read, and its replay of an epoch that fails, both
start at or after its committed position, and a handover resumes from it. When the lease changes
hands two workers may both trim for a moment, which deletes nothing twice. On NATS the engine
purges what its consumers are past itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from egress.clock import Clock
from egress.engines import Engine, LogRetention
from egress.runtime.options import RunOptions
from egress.runtime.plan import Plan
from egress.runtime.unit import Unit

logger = logging.getLogger(__name__)


def log_readers(plan: Plan) -> dict[str, list[str]]:
    """Each log stream some computation reads (a stream's lanes, ``egress.runtime.lanes``) → those
    computations' ids (in Spec order)."""
    readers: dict[str, list[str]] = {}
    for computation in plan.computations.values():
        for lane in computation.input_lanes:
            readers.setdefault(lane, []).append(computation.computation_id)
    return readers


def log_retention(engine: Engine) -> LogRetention | None:
    """``engine`` as a :class:`LogRetention`, when its log is the runtime's to trim (else ``None``)."""
    return engine if isinstance(engine, LogRetention) else None


async def trim_consumed(engine: LogRetention, plan: Plan, options: RunOptions) -> int:
    """Trim once: the log batches of ``plan``'s streams that every reader is past (by more than
    ``options.log_retention`` messages); returns the batches deleted."""
    return await engine.trim_log(log_readers(plan), options.log_retention)


def trimming_unit(plan: Plan) -> Unit | None:
    """The unit whose worker trims a shared database's log: the first computation's partition 0
    (``None`` without computations: then no stream has a reader and nothing is trimmed)."""
    first = next(iter(plan.computations), None)
    return None if first is None else Unit.computation(first, 0)


async def trim_periodically(engine: LogRetention, where: str, plan: Plan, options: RunOptions, clock: Clock,
                            holds: Callable[[], bool] | None = None) -> None:
    """:func:`trim_consumed` every ``options.log_trim_period`` seconds, until cancelled; with
    ``holds``, only in the periods it returns True (a worker running :func:`trimming_unit`).
    A failure is logged, naming the log ``where`` (the engine's location)."""
    while True:
        await clock.sleep(options.log_trim_period)
        if holds is not None and not holds():
            continue
        try:
            await trim_consumed(engine, plan, options)
        except Exception as error:  # the next commit meets the same engine and stops the run if it must
            logger.warning("could not trim the log of %s: %s: %s", where, type(error).__name__, error)
