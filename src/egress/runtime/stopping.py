"""The way out of a partition job that failed: commit the acknowledgements it had received.

A job stops on an error (its process function raised, a row did not fit its schema, ...) in the
middle of an epoch whose batch is not committed. The sinks may have received 2xx answers for
messages of earlier, committed epochs since the last commit; without a commit of their progress a
rerun would POST every one of them again. :func:`commit_on_failure` commits that progress alone:
no input position, no outbox, no state or timer change of the failed epoch (those are discarded,
and the batch is processed again by the next run), so the commit changes nothing but what the
sinks acknowledged.
"""

from __future__ import annotations

import logging

from egress.connectors.base import Sink
from egress.engines import Engine, EpochCommit, FencedError, SinkProgress

logger = logging.getLogger(__name__)


def acknowledgements_commit(consumer: str, partition: int, generation: int, sinks: dict[str, Sink],
                        committed: dict[str, SinkProgress]) -> EpochCommit | None:
    """The commit of what every sink acknowledged since ``committed`` (its progress as last
    committed, by sink id), under lease ``generation``; ``None`` when no sink advanced."""
    progress = {sink_id: sink.progress() for sink_id, sink in sinks.items()}
    if not progress or progress == committed:
        return None
    low = min(p.max_persisted_seq_no for p in progress.values())
    return EpochCommit(consumer, partition, generation, sink_progress=progress, outbox_acknowledged_seq=low)


async def commit_on_failure(engine: Engine, commit: EpochCommit | None, failure: BaseException) -> None:
    """Commit ``commit`` (from :func:`acknowledgements_commit`) on the way out of a job that stopped on
    ``failure``; a lease lost (``FencedError``) or a failed commit is logged and noted on
    ``failure``, which stays the error the run reports."""
    if commit is None or isinstance(failure, FencedError):
        return
    try:
        await engine.commit(commit)
    except Exception as error:  # the run already stops on `failure`: this one only costs re-sends
        note = (f"the acknowledgements of {commit.origin} received before it were not committed "
                f"({type(error).__name__}: {error}): the next run sends those messages again")
        logger.warning("%s", note)
        failure.add_note(note)
