"""A partition job's commits that only move its read positions, gathered for up to ``epoch_period``.

An epoch whose function emitted nothing, changed no state or timer and whose sinks acknowledged
nothing new (a filter dropping its input, a computation that only reads) commits nothing but its
input positions. Nothing waits for such a commit: the outputs of the messages it read are none, the
job's own in-memory positions are what this process's readers go by (``job.positions()``, the
http source's backlog), and a restart from the positions before it reads those messages again and
emits nothing again. So, like acknowledgements, these commits wait up to ``epoch_period`` (on the
run's clock) for the next commit that carries something, which carries the newer positions too;
without one, the job commits the positions once they are due (its wait ends then:
:meth:`DeferredPositions.trigger`), and at once when it stops or its input ends. Until then the job
is not idle, so ``--until-drained`` ends only after they are committed.
"""

from __future__ import annotations

from egress.clock import Clock
from egress.engines import EpochCommit, SinkProgress


def moves_positions_only(commit: EpochCommit, committed_progress: dict[str, SinkProgress]) -> bool:
    """Whether ``commit`` changes nothing but input positions (and the watermark, kept with them)."""
    return not (commit.log_appends or commit.outbox or commit.outbox_chunks or commit.state_writes
                or commit.external_state_writes or commit.timers_set or commit.timers_deleted
                or commit.log_traces or commit.outbox_traces) and commit.sink_progress == committed_progress


class DeferredPositions:
    """The position-only commit a partition job holds back, due ``period`` seconds (``clock.now()``)
    after the first epoch it holds."""

    def __init__(self, clock: Clock, period: float) -> None:
        self._clock = clock
        self._period = period
        self._held: EpochCommit | None = None
        self._due = 0.0
        self._messages = 0  # input messages the held epochs processed (counted once committed)

    @property
    def holding(self) -> bool:
        """Whether a position-only commit waits."""
        return self._held is not None

    def trigger(self, trigger: float | None) -> float | None:
        """The earlier of ``trigger`` (a ``clock.now()`` time, ``None``: none) and when the held
        commit is due: when the job's wait must end."""
        if self._held is None:
            return trigger
        return self._due if trigger is None else min(trigger, self._due)

    def take(self, commit: EpochCommit | None, messages: int, committed_progress: dict[str, SinkProgress], *,
             may_hold: bool) -> tuple[EpochCommit | None, int]:
        """What the epoch commits now and the input messages that commit covers: ``commit`` (the
        epoch's, ``None`` when it changed nothing; ``messages`` it processed) unless it only moves
        positions and ``may_hold`` (the job is not stopping, its input not ended) and the held one is
        not due, then ``None`` (held); with ``commit`` ``None``, the held one once due or when
        ``not may_hold``. A commit carries every position (``EpochCommit.input_positions`` are
        absolute), so the epoch's supersedes the held one."""
        now = self._clock.now()
        if commit is not None and may_hold and self._period > 0 and moves_positions_only(commit, committed_progress):
            if self._held is None:
                self._due = now + self._period
            self._held, self._messages = commit, self._messages + messages
            commit, messages = None, 0
        if commit is None:
            if self._held is None or (may_hold and now < self._due):
                return None, 0
            commit = self._held
        covered = messages + self._messages
        self._held, self._messages = None, 0
        return commit, covered
