"""``egress redrive``: re-send the dead letters of a file through an HTTP sink of a pipeline.

The letters of the named sink (``COMPUTATION/SINK``; lines of other sinks sharing the file are left
alone) are sent through a fresh instance of that sink built from the Spec and DynamicSpec as they are
now (that sink alone, :func:`load_redrive_target`): its URL, headers, TLS settings, retries,
redirects and throttler, through its own delivery path (:meth:`Sink.distribute`, then its
acknowledgements). Each message keeps its message id, so its
idempotency key (the async HTTP sink's ``Idempotency-Key``, the webhook sink's ``webhook-id``; for
the Firehose sink, the letters of one batch are re-formed into that batch, under the same request
id). A webhook sink's letter goes back to the endpoint its line names (``endpoint``), signed with
that endpoint's secrets as the DynamicSpec gives them now.

What was delivered is recorded in ``<file>.redriven`` (one JSON line per letter, fsync'd after each
acknowledgement, :mod:`egress.connectors.dead_letters`), so running redrive again skips it: a line is
delivered once however often redrive runs. A letter whose redrive fails again (attempts or deadline
exhausted) is not recorded and stays for the next run; the sink goes on with the others. Killed
between an acknowledgement and its record, the next run sends those letters again, with the same
idempotency keys (at-least-once). One redrive at a time per file: the record is locked for the run.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egress.clock import Clock, RealClock
from egress.connectors.base import SINKS, SinkContext
from egress.connectors.dead_letters import (
    DeadLetter,
    DeadLetterFiles,
    DeadLetterOutput,
    LetterKey,
    encode_redriven,
    read_dead_letters,
    redrive_record_path,
    redriven_counts,
)
from egress.engines import OutboxMessage
from egress.errors import EgressError
from egress.line_files import LineFile, LineFileBusy
from egress.observe import Metrics, StatusTree
from egress.runtime.plan import SinkPlan, build_sink_plan, load_specs
from egress.spec import DynamicSpec
from egress.throttler import Throttling


class RedriveError(EgressError):
    """``egress redrive`` cannot start: the sink is unknown or cannot redrive, or another redrive
    holds the file. The message names what is wrong and the fix."""


@dataclass
class RedriveReport:
    """What a redrive did with the letters of ``sink`` in ``file``: ``delivered`` (now recorded as
    redriven), ``failed`` (letter and error; still to redrive), ``already_redriven`` (lines recorded
    by an earlier run), ``not_attempted`` (left after the sink stopped on a terminal error),
    ``other_sinks`` (lines of other sinks, by ``computation/sink``), ``torn_bytes`` (an incomplete
    last line: not read as a letter, so not sent; the redrive is then not ``ok``)."""

    file: Path
    sink: str
    delivered: list[DeadLetter] = field(default_factory=list)
    failed: list[tuple[DeadLetter, str]] = field(default_factory=list)
    already_redriven: int = 0
    not_attempted: int = 0
    other_sinks: collections.Counter[str] = field(default_factory=collections.Counter)
    torn_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.not_attempted and not self.torn_bytes


@dataclass(frozen=True)
class RedriveTarget:
    """The sink a redrive sends through: its computation id, its plan, and the DynamicSpec (its file)
    whose throttlers it takes."""

    computation_id: str
    sink: SinkPlan
    dynamic_spec: DynamicSpec
    dynamic_spec_file: str | None

    @property
    def name(self) -> str:
        return f"{self.computation_id}/{self.sink.sink_id}"


def load_redrive_target(spec_path: str | Path, dynamic_spec_path: str | Path | None, name: str,
                        dead_letter_file: str | Path) -> RedriveTarget:
    """The sink ``name`` (``COMPUTATION/SINK``) of the Spec file, built and checked alone
    (:func:`~egress.runtime.plan.build_sink_plan`): its parameters, its dynamic parameters, the
    streams it reads and its throttler, with ``dead_letter_file`` as its ``dead_letter_path``; the
    process functions are not imported and nothing else of the Spec is checked, so a redrive runs
    from any folder. Raises :class:`SpecError` (the files, the sink) and :class:`RedriveError`
    (no such sink, not an HTTP sink)."""
    spec, dynamic = load_specs(spec_path, dynamic_spec_path)
    spec_file = str(spec_path)
    dynamic_file = None if dynamic_spec_path is None else str(dynamic_spec_path)
    known = set(SINKS.names())  # an unknown class of the named sink is reported by build_sink_plan
    classes = {(computation_id, sink_id): SINKS.get(sink.sink_class_name) if sink.sink_class_name in known else None
               for computation_id, computation in spec.computations.items()
               for sink_id, sink in computation.sinks.items()}
    computation_id, sink_id = _redrivable(classes, name, spec_file)
    sink = build_sink_plan(spec, dynamic, computation_id, sink_id, spec_file=spec_file,
                           dynamic_spec_file=dynamic_file,
                           parameter_overrides={"dead_letter_path": str(Path(dead_letter_file).absolute())})
    return RedriveTarget(computation_id, sink, dynamic, dynamic_file)


def _redrivable(classes: dict[tuple[str, str], Any], name: str, spec_file: str | None) -> tuple[str, str]:
    """``name`` as (computation id, sink id) if ``classes`` (the sink classes by those ids) has it and
    its class can redrive. Raises :class:`RedriveError` listing those that can."""
    redrivable = [f"{c}/{s}" for (c, s), sink_class in classes.items() if hasattr(sink_class, "redrive_progress")]
    choices = (", ".join(redrivable) if redrivable
               else "none: the Spec has no async_http, firehose_http, batching_http or webhook_http sink")
    computation_id, _, sink_id = name.partition("/")
    if (computation_id, sink_id) not in classes:
        raise RedriveError(f"--sink {name}: no such sink in {spec_file or 'the Spec'}; give COMPUTATION/SINK, "
                           f"one of: {choices}")
    sink_class = classes[(computation_id, sink_id)]
    if sink_class is not None and not hasattr(sink_class, "redrive_progress"):
        raise RedriveError(f"--sink {name} is a {sink_class.__name__}, not an HTTP sink: redrive sends through "
                           f"an async_http, firehose_http, batching_http or webhook_http sink, one of: {choices}")
    return computation_id, sink_id


async def redrive(target: RedriveTarget, file: str | Path, *, clock: Clock | None = None,
                  metrics: Metrics | None = None, throttler_url: str | None = None) -> RedriveReport:
    """Redrive the letters of the sink ``target`` in ``file`` (see the module docs).

    Raises :class:`RedriveError` (another redrive holding the file) and
    :class:`~egress.connectors.dead_letters.DeadLetterFileError` (the file or its record).
    """
    path = Path(file)
    letters, torn = read_dead_letters(path)
    report = RedriveReport(path, target.name, torn_bytes=torn)
    mine = []
    for letter in letters:
        if (letter.computation, letter.sink) == (target.computation_id, target.sink.sink_id):
            mine.append(letter)
        else:
            report.other_sinks[f"{letter.computation}/{letter.sink}"] += 1
    record = LineFile(redrive_record_path(path))
    try:
        with record.exclusively():
            pending = _pending(mine, redriven_counts(path), report)
            if pending:
                await _send(target, pending, record, report, clock or RealClock(), metrics or Metrics(),
                            throttler_url)
    except LineFileBusy:
        raise RedriveError(f"{record.path} is held by another egress redrive of {path}: wait for it to finish") \
            from None
    return report


def _pending(letters: list[DeadLetter], redriven: collections.Counter[LetterKey],
             report: RedriveReport) -> dict[LetterKey, list[DeadLetter]]:
    """The lines not yet redriven, by message, in file order: a message's first lines are matched by
    its record lines. A message with several such lines is sent once and recorded for each."""
    seen: collections.Counter[LetterKey] = collections.Counter()
    pending: dict[LetterKey, list[DeadLetter]] = {}
    for letter in letters:
        seen[letter.key] += 1
        if seen[letter.key] <= redriven[letter.key]:
            report.already_redriven += 1
        else:
            pending.setdefault(letter.key, []).append(letter)
    return pending


class _FailedAgain(DeadLetterFiles):
    """The dead-letter output of a redriving sink: a letter failing again is only noted (it stays in
    the file, unrecorded), and the sink acknowledges it and goes on."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: dict[LetterKey, str] = {}

    def open(self, path: str | Path) -> DeadLetterOutput:
        return _Noted(Path(path), self.errors)


class _Noted:
    def __init__(self, path: Path, errors: dict[LetterKey, str]) -> None:
        self.path = path
        self._errors = errors

    def append(self, letters: Sequence[DeadLetter]) -> asyncio.Future[int]:
        for letter in letters:
            self._errors[letter.key] = letter.error
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(0)
        return future


async def _send(target: RedriveTarget, pending: dict[LetterKey, list[DeadLetter]], record: LineFile,
                report: RedriveReport, clock: Clock, metrics: Metrics, throttler_url: str | None) -> None:
    """Send one message per pending key through a new instance of the sink and record each delivery.
    A letter the sink cannot re-form as a message (its ``redrive_row`` raising ``ValueError``) is not
    sent: it is reported failed with that error."""
    sink_plan = target.sink
    sink_class: Any = sink_plan.sink_class
    # A dead-letter output even when the Spec no longer names one: each letter stands alone.
    parameters = sink_plan.parameters.model_copy(update={"dead_letter_path": str(report.file)})
    rows: dict[LetterKey, dict[str, Any]] = {}
    for lines in pending.values():
        try:
            rows[lines[0].key] = _row(sink_class, parameters, sink_plan.dynamic_parameters, lines[0])
        except ValueError as error:
            report.failed.append((lines[0], str(error)))
    sending = [lines[0] for lines in pending.values() if lines[0].key in rows]
    if not sending:
        return
    failed_again = _FailedAgain()
    acknowledged = asyncio.Event()
    dynamic = target.dynamic_spec
    throttling = Throttling(dynamic, clock, registry=metrics.registry, throttler_url=throttler_url,
                            file=target.dynamic_spec_file) if dynamic.throttlers or throttler_url else None
    context = SinkContext(target.computation_id, sink_plan.sink_id, 0, clock, metrics, StatusTree(),
                          lambda _progress: acknowledged.set(), throttling, failed_again)
    sink = sink_class.create(context, parameters, sink_plan.dynamic_parameters, sink_class.redrive_progress(sending))
    try:
        sink.distribute([OutboxMessage(seq, sink_plan.stream_id, letter.message_id, b"[]", None, rows[letter.key])
                         for seq, letter in enumerate(sending, start=1)])
        done = 0
        while done < len(sending):
            await acknowledged.wait()
            acknowledged.clear()
            progress = sink.progress()
            sink.committed(progress)
            newly = sending[done:progress.max_persisted_seq_no]
            done = progress.max_persisted_seq_no
            delivered = [letter for letter in newly if letter.key not in failed_again.errors]
            now = clock.now()
            record.append(b"".join(encode_redriven(line, now) for letter in delivered for line in pending[letter.key]))
            report.delivered += delivered
            report.failed += [(letter, failed_again.errors[letter.key]) for letter in newly
                              if letter.key in failed_again.errors]
            if sink.terminal_error is not None and done < len(sending):
                report.failed.append((sending[done], sink.terminal_error))
                report.not_attempted = len(sending) - done - 1
                return
    finally:
        await sink.close()
        if throttling is not None:
            await throttling.aclose()


def _row(sink_class: Any, parameters: Any, dynamic_parameters: Any, letter: DeadLetter) -> dict[str, Any]:
    """The outbox row of ``letter``: the sink's own (``redrive_row``: e.g. the webhook sink's endpoint
    column), else the payload in ``payload_column``. Raises ``ValueError`` when it cannot be formed."""
    redrive_row = getattr(sink_class, "redrive_row", None)
    if redrive_row is not None:
        row: dict[str, Any] = redrive_row(parameters, dynamic_parameters, letter)
        return row
    return {parameters.payload_column: letter.payload}


__all__ = ["RedriveError", "RedriveReport", "RedriveTarget", "load_redrive_target", "redrive"]
