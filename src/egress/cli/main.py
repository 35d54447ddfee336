"""The ``egress`` command line: ``run``, ``validate``, ``status``, ``receiver``, ``redrive``, ``state``,
``throttler``; ``egress --version``. The exit codes every command uses: ``egress.cli.exit_codes.EXIT_CODES``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import functools
import importlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from egress.cli.addresses import cannot_listen, cannot_serve, file_to_append, file_to_write, unusable_state_dir
from egress.cli.exit_codes import EXIT_CODES
from egress.cli.interrupts import Interrupts
from egress.cli.output import (
    LogFormatChoice,
    LogFormatOption,
    LogLevelChoice,
    LogLevelOption,
    Output,
    command_group,
    start_output,
)
from egress.engines.sqlite import state_directory
from egress.errors import EgressError, ProcessFunctionError, SourceDataError, SpecError
from egress.observe.logs import add_secret, bind_log_context, secrets_of_spec
from egress.observe.status import egress_version
from egress.runtime import EngineFactory, Pipeline, RunOptions, RunResult, load_plan
from egress.runtime.dynamic_spec import DYNAMIC_SPEC_STATUS
from egress.runtime.garbage_collection import settle_for_exit, tune_for_run
from egress.runtime.layout import check_recorded_layout, way_out
from egress.runtime.options import EngineChoice, parse_engine
from egress.runtime.pipeline import nats_engine_factory, shared_sqlite_engine, sqlite_engine

if TYPE_CHECKING:
    from rich.console import Console

HELP = ("egress: deliver event streams to the outside world, reliably.\n\nExit codes:\n\n"
        + "\n\n".join(f"{code}: {meaning}" for code, meaning in EXIT_CODES.items()))
_own = command_group()  # the commands defined in this module; command_line() puts them in the command line
console: Console | None = None  # None: egress.cli.output.stderr_console(), made when first printed to
output = Output(console)  # replaced by a command's --log-format

# The commands of other modules, in the order ``egress --help`` lists them: name → (module, attribute).
# A command is registered as a command, a group (``throttler serve``) with ``add_typer``.
_IMPORTED_COMMANDS = {"redrive": ("egress.cli.redrive", "redrive_command"),
                      "status": ("egress.cli.status", "status_command")}
_IMPORTED_GROUPS = {"throttler": ("egress.cli.throttler", "throttler_app"), "state": ("egress.cli.state", "app"),
                    "endpoint": ("egress.cli.endpoint", "endpoint_app")}


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"egress {egress_version()}")
        raise typer.Exit(0)


@_own.callback()
def egress(
    version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """egress: deliver event streams to the outside world, reliably."""

SpecArgument = Annotated[Path, typer.Argument(metavar="SPEC", help="The Spec file (.yson, .yaml or .json).")]
DynamicSpecOption = Annotated[Optional[Path], typer.Option("--dynamic-spec", help="The DynamicSpec file.")]  # noqa: UP045


def _fail_on_spec_error(error: SpecError) -> None:
    output.say(error.format(), style="red", level=logging.ERROR)
    raise typer.Exit(2)


def _fail(text: str, code: int = 1) -> None:
    output.say(text, style="red", level=logging.ERROR)
    raise typer.Exit(code)


def _never_log_the_secrets_of(plan: Any) -> None:
    """Register every secret the Spec and DynamicSpec refer to (``egress.observe.logs.secrets_of_spec``)."""
    base = Path(plan.spec_file).parent if plan.spec_file else None
    for document in (plan.spec.model_dump(mode="json"), plan.dynamic_spec.model_dump(mode="json")):
        for secret in secrets_of_spec(document, base):
            add_secret(secret)


@_own.command(name="validate")
def validate(
    spec: SpecArgument,
    dynamic_spec: DynamicSpecOption = None,
    state_dir: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Also check that the Spec fits the committed state here (read only).")] = None,
) -> None:
    """Check a Spec (and DynamicSpec) without running anything; one line per problem."""
    global output
    output = Output(console)
    try:
        plan = load_plan(spec, dynamic_spec)
        if state_dir is not None and (problem := unusable_state_dir(state_dir)) is not None:
            _fail(problem)
        note = None if state_dir is None else check_recorded_layout(plan, state_dir)
    except SpecError as error:
        _fail_on_spec_error(error)
        return
    except EgressError as error:
        output.say(str(error), style="red")
        raise typer.Exit(1) from None
    typer.echo(f"{spec}: valid pipeline {plan.spec.pipeline!r} with {len(plan.sources)} source(s), "
               f"{len(plan.computations)} computation(s)")
    if note is not None:
        typer.echo(note)


def _in_a_context_of_its_own(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` run in a copy of the current ``contextvars`` context: the log context it binds
    (``bind_log_context``) ends with it, also when it is invoked in-process (tests)."""

    @functools.wraps(command)
    def wrapper(*arguments: Any, **keywords: Any) -> None:
        contextvars.copy_context().run(command, *arguments, **keywords)

    return wrapper


@_own.command(name="run")
@_in_a_context_of_its_own
def run(
    spec: SpecArgument,
    dynamic_spec: DynamicSpecOption = None,
    state_dir: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Where committed state lives (default: .egress/<pipeline> in the current folder).")] = None,
    until_drained: Annotated[bool, typer.Option(
        help="Stop once every source is read and every message delivered (exit 1 if a sink is blocked, "
             "2 if committed messages are out of this Spec's reach).")] = False,
    report: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        callback=file_to_write, help="Write the final counters as JSON here.")] = None,
    quiet: Annotated[bool, typer.Option(help="No progress line and no summary table (errors still print).")] = False,
    http_port: Annotated[Optional[int], typer.Option(  # noqa: UP045
        min=0, max=65535,
        help="Serve the dashboard at /, /metrics (Prometheus), /status (JSON), /healthz and /readyz on this port "
             "(0 picks one).")] = None,
    http_host: Annotated[str, typer.Option(help="Address for --http-port.")] = "127.0.0.1",
    throttler_url: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Share the throttlers of `egress throttler serve` at this URL (default: in this process).")] = None,
    engine: Annotated[str, typer.Option(
        help="Where committed state lives: sqlite (the state directory) or nats://HOST:PORT[,HOST:PORT...] "
             "(NATS JetStream: every process started with the same Spec and URL joins one cluster).")] = "sqlite",
    worker_id: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="This worker's name in a NATS cluster (default: hostname-pid); a second process under the id of a "
             "running one is refused.")] = None,
    processes: Annotated[int, typer.Option(
        min=1, help="Run N worker processes on this machine, sharing the units of the pipeline.")] = 1,
    lease_ttl: Annotated[float, typer.Option(
        min=1.0, help="Cluster: seconds a worker's leases last without renewal (its units' failover time).")] = 10.0,
    heartbeat_period: Annotated[Optional[float], typer.Option(  # noqa: UP045
        min=0.1, help="Cluster: seconds between renewals of a worker's leases (default: a quarter of --lease-ttl).")
    ] = None,
    replicas: Annotated[int, typer.Option(
        min=1, max=5, help="NATS: copies of the pipeline's stream (1; 3 on a 3-node cluster survives the loss of "
                           "a node). Every worker must give the same.")] = 1,
    shared_state: Annotated[bool, typer.Option(hidden=True, help="A worker process of --processes.")] = False,
    supervisor: Annotated[Optional[int], typer.Option(  # noqa: UP045
        hidden=True, help="A worker process of --processes: its supervisor's pid (it tells of interrupts; the "
                          "worker stops when it ends).")] = None,
    log_format: LogFormatOption = LogFormatChoice.text,
    log_level: LogLevelOption = LogLevelChoice.info,
    log_retention: Annotated[int, typer.Option(
        min=0, help="Messages of each log partition kept after every computation read them, for replay "
                    "(SQLite, also with --processes; the rest is trimmed).")] = 0,
    otlp_endpoint: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Send OpenTelemetry traces to this OTLP/HTTP receiver (e.g. http://127.0.0.1:4318; default: "
             "OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing). Sampling: OTEL_TRACES_SAMPLER[_ARG]; "
             "needs egress[tracing].")] = None,
) -> None:
    """Run a pipeline. Ctrl-C stops after the message in hand, committing what was processed; run again to resume.

    Exit codes: 0 drained or stopped; 1 a sink blocked or a failure; 2 a Spec problem; 130 interrupted
    before everything was delivered (--until-drained) or a second Ctrl-C.
    """
    global output
    output = start_output(console, log_format, log_level, "egress.run", urls=(engine, throttler_url or ""))
    try:
        plan = load_plan(spec, dynamic_spec)
        choice = parse_engine(engine)
    except SpecError as error:
        _fail_on_spec_error(error)
        return
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--engine") from None
    _never_log_the_secrets_of(plan)
    bind_log_context(pipeline=plan.spec.pipeline, **({"worker": worker_id} if worker_id else {}))
    if processes == 1:  # --processes N: each worker process sends its own spans
        _start_tracing(otlp_endpoint, plan.spec.pipeline, worker_id)
    quiet = quiet or output.json  # JSON: records only (progress and summary as records), no live line or table
    directory = state_dir or Path(".egress") / plan.spec.pipeline
    if (problem := unusable_state_dir(directory)) is not None:
        _fail(problem)
    options = RunOptions(until_drained=until_drained, throttler_url=throttler_url, lease_ttl=lease_ttl,
                         heartbeat_period=heartbeat_period if heartbeat_period is not None else lease_ttl / 4,
                         replicas=replicas, log_retention=log_retention)
    if processes > 1:
        raise typer.Exit(_run_processes(plan, spec, dynamic_spec, directory, choice, processes, options,
                                        engine=engine, quiet=quiet, report=report, worker_id=worker_id,
                                        http_port=http_port, http_host=http_host, throttler_url=throttler_url,
                                        log_format=log_format, log_level=log_level, otlp_endpoint=otlp_endpoint))
    if worker_id is not None and not choice.is_nats and not shared_state:
        raise typer.BadParameter("names a worker of a cluster: use it with --engine nats://HOST:PORT, or run "
                                 "several processes on this state directory with --processes N",
                                 param_hint="--worker-id")
    factory, member = _engine_for(choice, shared_state, worker_id)
    pipeline = Pipeline(plan, directory, options=options, http_port=http_port, http_host=http_host,
                        engine_factory=factory, worker_id=member)

    interrupts = _interrupts_of(pipeline, supervisor)
    tune_for_run()  # the garbage collector's settings for a run (egress.runtime.garbage_collection)
    try:
        result = asyncio.run(_drive(pipeline, quiet, interrupts))
    except KeyboardInterrupt:  # between the loop's handlers going and the process's below: in asyncio.run's end
        interrupts.exit_at_once()
    except SpecError as error:  # refused before anything ran: the Spec does not fit the directory or the cluster
        _fail_on_spec_error(error)
        return
    except EgressError as error:
        _fail(str(error))
        return
    except OSError as error:  # the state directory or the --http-port address cannot be used
        if error.filename is None and http_port is not None:
            _fail(cannot_listen(http_host, http_port, error, port_option="--http-port", host_option="--http-host"))
        _fail(f"cannot start: {error.filename or directory}: {error.strerror or error}")
        return
    finally:
        interrupts.after_the_loop()  # the summary, the report and settle_for_exit are still to come
    _finish(pipeline, result, spec=spec, dynamic_spec=dynamic_spec, directory=directory, report=report, quiet=quiet,
            until_drained=until_drained)


def _interrupts_of(pipeline: Pipeline, supervisor: int | None) -> Interrupts:
    """The run's interrupts; a worker of ``--processes`` (its ``supervisor``'s pid given) says
    nothing of them and ends with its supervisor (``egress.cli.supervision``: its SIGTERM stops the
    run as a Ctrl-C does; before the run starts, at once)."""
    if supervisor is not None:
        from egress.cli.supervision import end_with

        end_with(supervisor)
    return Interrupts(output, pipeline.request_stop, pipeline.interrupt, announce=supervisor is None)


def _start_tracing(endpoint: str | None, pipeline: str, worker_id: str | None) -> None:
    """Turn OpenTelemetry tracing on when ``--otlp-endpoint`` or the environment asks for it
    (``egress.observe.tracing``, imported only then), flushed and stopped at exit; exit 2 with the fix
    when it cannot start."""
    if endpoint is None and not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                                 or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return
    import atexit

    from egress.errors import TracingConfigError
    from egress.observe import tracing

    attributes = {"egress.pipeline": pipeline, **({"egress.worker": worker_id} if worker_id else {})}
    try:
        tracing.configure(endpoint, resource_attributes=attributes)
    except TracingConfigError as error:
        _fail(str(error), 2)
    atexit.register(tracing.shutdown)


def _run_processes(plan: Any, spec: Path, dynamic_spec: Path | None, directory: Path, choice: EngineChoice,
                   processes: int, options: RunOptions, *, engine: str, quiet: bool, report: Path | None,
                   worker_id: str | None, http_port: int | None, http_host: str, throttler_url: str | None,
                   log_format: LogFormatChoice, log_level: LogLevelChoice, otlp_endpoint: str | None = None) -> int:
    """``egress run --processes N``: N worker processes sharing the pipeline's units; their exit code."""
    from egress.cli.processes import ProcessesRun

    shared = [str(spec.absolute()), "--engine", engine, "--lease-ttl", str(options.lease_ttl),
              "--heartbeat-period", str(options.heartbeat_period), "--replicas", str(options.replicas)]
    shared += ["--dynamic-spec", str(dynamic_spec.absolute())] if dynamic_spec is not None else []
    shared += ["--until-drained"] if options.until_drained else []
    shared += ["--throttler-url", throttler_url] if throttler_url is not None else []
    shared += ["--otlp-endpoint", otlp_endpoint] if otlp_endpoint is not None else []
    shared += ["--http-host", http_host, "--log-format", log_format.value, "--log-level", log_level.value]
    parent = ProcessesRun(plan, directory, choice, processes, shared, quiet=quiet, report=report,
                          base_id=worker_id, http_port=http_port)
    try:
        return parent.run()
    except SpecError as error:
        _fail_on_spec_error(error)
    except EgressError as error:
        _fail(str(error))
    return 1


async def _drive(pipeline: Pipeline, quiet: bool, interrupts: Interrupts | None = None) -> RunResult:
    """Run ``pipeline`` with Ctrl-C and SIGTERM as an orderly stop (a second one exits at once:
    ``interrupts``, by default its own), showing progress: a live line on a terminal, a line every
    :data:`PROGRESS_PERIOD` seconds otherwise, JSON records with ``--log-format json``, nothing with ``quiet``; what
    :class:`_Reporter` tells is told within :data:`NEWS_PERIOD` seconds in every case."""
    from egress.cli.report import progress_line, snapshot

    loop = asyncio.get_running_loop()
    interrupts = interrupts or Interrupts(output, pipeline.request_stop, pipeline.interrupt)
    interrupts.during_the_run(loop)
    run_task = asyncio.create_task(pipeline.run())
    started = time.monotonic()
    reported = _Reporter(pipeline)
    live = None
    if not quiet and output.console.is_terminal:
        from rich.live import Live  # only on a terminal
        from rich.text import Text

        live = Live(console=output.console, refresh_per_second=4, transient=True)
    with live or contextlib.nullcontext():
        while not run_task.done():
            if live is not None:
                live.update(Text(progress_line(snapshot(pipeline), time.monotonic() - started)))
            await asyncio.wait({run_task}, timeout=NEWS_PERIOD)
            reported.news()  # each tick, terminal or not: the address, a DynamicSpec, an error, at once
            elapsed = time.monotonic() - started
            if live is None and not run_task.done() and pipeline.running and elapsed >= reported.next_progress:
                reported.next_progress += PROGRESS_PERIOD
                if output.json:
                    output.say("progress", **snapshot(pipeline))
                elif not quiet:
                    output.console.print(progress_line(snapshot(pipeline), elapsed), highlight=False)
    result = await run_task
    interrupts.finished = True
    return result


NEWS_PERIOD = 0.25
"""Seconds between looks at what a user must see while a run goes on (:class:`_Reporter`)."""
PROGRESS_PERIOD = 5.0
"""Seconds between progress lines (or JSON progress records) when standard error is not a terminal."""


def _finish(pipeline: Pipeline, result: RunResult, *, spec: Path, dynamic_spec: Path | None, directory: Path,
            report: Path | None, quiet: bool, until_drained: bool) -> None:
    """The end of ``egress run``: the report file, the summary, what to do about dead letters, blocked
    sinks and unreachable work, then the exit code (``egress.cli.exit_codes``)."""
    from egress.cli.report import final_report, summary_table

    values = final_report(pipeline, result)
    if report is not None:
        report.write_text(json.dumps(values, indent=2) + "\n")
    if output.json:
        output.show(lambda: summary_table(values), "run finished", **values)
    elif not quiet:
        output.console.print(summary_table(values))
    location = pipeline.location or state_directory(directory)
    if not quiet and _nothing_new(result, values):
        output.say(f"nothing new: {location.name} already holds everything the sources had; to start over, "
                   f"{location.start_over}")
    _undelivered(pipeline, values, spec, dynamic_spec)
    for line in result.blocked:
        output.say(f"blocked: {line}", style="red", level=logging.ERROR)
    for line in result.unreachable:
        output.say(f"unreachable in {location.name}: {line}", style="red", level=logging.ERROR)
    if result.error is not None:
        output.say(f"error: {result.error}", style="red", level=logging.ERROR)
        hint = _what_to_do_about(result.error)
        if hint:
            output.say(hint, style="yellow", level=logging.WARNING)
    if result.ok and until_drained and not result.drained:
        output.say("interrupted before every message was delivered: run again to finish", level=logging.WARNING)
        raise typer.Exit(130)
    if result.unreachable:
        output.say(f"not drained: this Spec cannot reach committed work in {location.name}; {way_out(location)}",
                   level=logging.ERROR)
        raise typer.Exit(2)
    raise typer.Exit(0 if result.ok else 1)


def _undelivered(pipeline: Pipeline, values: dict[str, Any], spec: Path, dynamic_spec: Path | None) -> None:
    """A line for each file that received undelivered records: dead letters (with their redrive
    command) and Firehose error outputs."""
    redrive_hint = f" --dynamic-spec {dynamic_spec}" if dynamic_spec is not None else ""
    for (path, sink), count in sorted(pipeline.dead_letters.by_file.items()):
        output.say(f"{count:,} dead letter(s) of {sink} written to {path}: once the endpoint is fixed, "
                   f"egress redrive {path} {spec} --sink {sink}{redrive_hint}", style="yellow", level=logging.WARNING,
                   sink=sink)
    for sink, written in values["error_outputs"].items():
        redrive = "" if _has_dead_letter_file(pipeline, sink) else (
            "; egress redrive reads dead letters, not this file: set dead_letter_path to redrive such records")
        output.say(f"{written['records']:,} record(s) of {sink} not delivered, written to the error output "
                   f"{written['path']}{redrive}", style="yellow", level=logging.WARNING, sink=sink)


def _has_dead_letter_file(pipeline: Pipeline, sink: str) -> bool:
    """Whether ``sink`` (``computation/sink``) writes dead letters as well (then the dead-letter line
    already gives the redrive command)."""
    computation, _, sink_id = sink.partition("/")
    plan = pipeline.plan.computations[computation].sinks[sink_id]
    return getattr(plan.parameters, "dead_letter_path", None) is not None


def _nothing_new(result: RunResult, values: dict[str, Any]) -> bool:
    """A run that drained without reading, processing or sending anything: the committed state already
    holds everything. Not a run stopped before then (Ctrl-C, SIGTERM, a live source read until stopped),
    which says nothing of what the sources still have."""
    idle = not values["rows_read"] and not values["posts"] and not values["messages_processed"]
    return result.ok and result.drained and idle


BAD_RECORD_FIX = (
    "to go on: leave the file as it is, set the source's parameters/on_bad_record to skip or dead_letter and run "
    "again; or correct the record within the same file (the same inode, its first 4,096 bytes unchanged) and run "
    "again: the source resumes at its committed position (`sed -i` and an editor that saves a new file make it "
    "another file, which is refused; docs/sources.md)")
PROCESS_FUNCTION_FIX = (
    "what the other partitions committed before the stop stays committed: its outputs are delivered as emitted "
    "when the pipeline runs again; a fixed process function handles the messages not yet processed")


def _what_to_do_about(error: BaseException) -> str | None:
    """The way on after a run stopped by ``error``, when there is one to say."""
    if isinstance(error, SourceDataError):
        return BAD_RECORD_FIX
    if isinstance(error, ProcessFunctionError):
        return PROCESS_FUNCTION_FIX
    return None


def _engine_for(choice: EngineChoice, shared_state: bool, worker_id: str | None) -> tuple[EngineFactory, str | None]:
    """The engine factory of a run and its worker id (``None``: an embedded run)."""
    if not choice.is_nats and not shared_state:
        return sqlite_engine, None
    from egress.runtime.cluster.worker import default_worker_id  # the cluster's modules: only for a worker

    member = worker_id or default_worker_id()
    if choice.is_nats:
        return nats_engine_factory(list(choice.servers), member), member
    return shared_sqlite_engine, member


class _Reporter:
    """Prints, once each, the events a user must see while a run goes on (the status endpoint's
    address, a DynamicSpec applied or ignored, a sink's error as its status path shows it)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self._port: int | None = None
        self._version = 0
        self._error: str | None = None
        self._status: dict[str, str] = {}  # the last status error printed per path
        self._dead_letters: set[tuple[Path, str]] = set()  # (file, computation/sink) with a dead letter shown
        self.next_progress = PROGRESS_PERIOD  # seconds into the run of the next progress line or record

    def news(self) -> None:
        pipeline = self._pipeline
        if pipeline.server is not None and pipeline.server.port is not None and self._port is None:
            self._port = pipeline.server.port
            output.say(f"dashboard, metrics and status at http://{pipeline.server.address}/ "
                       "(/ the dashboard, /metrics, /status, /healthz, /readyz)",
                       url=f"http://{pipeline.server.address}/")
        if pipeline.dynamic_spec_version != self._version:
            self._version = pipeline.dynamic_spec_version
            output.say(f"DynamicSpec {pipeline.plan.dynamic_spec_file} applied")
        if pipeline.dynamic_spec_error != self._error:
            self._error = pipeline.dynamic_spec_error
            if self._error:
                output.say(f"DynamicSpec {self._error}", style="yellow", level=logging.WARNING)
        for entry in pipeline.status.entries():
            # Each distinct error once, not every retry; libcurl's "after N ms" is not a new error.
            seen = _ELAPSED.sub("", entry.error)
            if entry.path != DYNAMIC_SPEC_STATUS and self._status.get(entry.path) != seen:
                first = entry.path not in self._status
                self._status[entry.path] = seen
                self._say_status(entry.path, entry.error, first)
        self._first_dead_letters()

    def _say_status(self, path: str, error: str, first: bool) -> None:
        """A status error as ``computation C sink S: error``; the first of a sink says that it retries."""
        sink = _sink_of(path)
        if not sink:
            output.say(f"{path}: {error}", style="yellow", level=logging.WARNING, path=path)
            return
        owners = [plan.computation_id for plan in self._pipeline.plan.computations.values()
                  if sink["sink"] in plan.sinks]
        where = f"computation {', '.join(owners)} sink {sink['sink']}" if owners else f"sink {sink['sink']}"
        hint = (" (the sink retries by its retry policy until delivered or given up; the progress line "
                "counts the retries)") if first else ""
        output.say(f"{where}: {error}{hint}", style="yellow", level=logging.WARNING, path=path,
                   computation=", ".join(owners), **sink)

    def _first_dead_letters(self) -> None:
        """The first dead letter of each sink and file (the summary counts them all at the end)."""
        for (path, sink), letter in self._pipeline.dead_letters.first.items():
            if (path, sink) in self._dead_letters:
                continue
            self._dead_letters.add((path, sink))
            output.say(f"dead letter of {sink} partition {letter.partition} seq {letter.seq} written to {path} "
                       f"(the partition goes on): {letter.error}", style="yellow", level=logging.WARNING,
                       computation=letter.computation, partition=letter.partition, sink=letter.sink,
                       message_id=letter.message_id)


_ELAPSED = re.compile(r" after \d+ ms")
"""libcurl's time to a failure inside its message (``Failed to connect to H:P after 3 ms``)."""


def _sink_of(path: str) -> dict[str, str]:
    """The ``sink`` field of a status path ``/sinks/<sink>/...`` (none for another path)."""
    parts = path.split("/")
    return {"sink": parts[2]} if len(parts) > 2 and parts[1] == "sinks" else {}


@_own.command(name="receiver")
def receiver(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535,
                                      help="Port (0 picks a free one; the chosen one is printed).")] = 8080,
    record: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        callback=file_to_append, help="Append one JSON line per request here.")] = None,
    fail_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of requests to fail.")] = 0.0,
    fail_status: Annotated[int, typer.Option(min=100, max=999, help="Status of injected failures.")] = 503,
    delay: Annotated[float, typer.Option(min=0.0, help="Seconds to wait before answering.")] = 0.0,
    fail_first: Annotated[int, typer.Option(
        min=0, help="Fail the first N requests of each idempotency key with --fail-status, then accept.")] = 0,
    seed: Annotated[Optional[int], typer.Option(help="Seed for repeatable fault injection.")] = None,  # noqa: UP045
    hold_after: Annotated[Optional[int], typer.Option(  # noqa: UP045
        min=0, help="Answer the first N requests, then hold every further one unanswered until POST /release "
                    "(POST /hold?after=M answers M more).")] = None,
    idempotency_header: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="The header that carries the key (default Idempotency-Key; with --verify-secret webhook-id, "
             "Standard Webhooks' message id).")] = None,
    verify_secret: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Check every request's Standard Webhooks signature with the whsec_ secrets of this file (one per "
             "line); a request without a valid one is answered 401 and counted in signature_failures.")] = None,
    fail_path: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        help="Answer every request to this path with --fail-status (an endpoint that is down; repeat it; "
             "POST /fail-path?path=P[&up=1] changes it while running).")] = None,
    protocol: Annotated[str, typer.Option(
        help="generic (record any request) or firehose (a strict Amazon Data Firehose HTTP endpoint).")] = "generic",
    access_key_env: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        help="firehose: an environment variable holding an accepted access key (repeat it during a rotation).")] = None,
    log_format: LogFormatOption = LogFormatChoice.text,
    log_level: LogLevelOption = LogLevelChoice.info,
) -> None:
    """Serve a local HTTP endpoint that records requests, counts duplicates and injects faults."""
    global output
    output = start_output(console, log_format, log_level, "egress.receiver")
    for name in access_key_env or []:
        add_secret(os.environ.get(name))
    if protocol not in ("generic", "firehose"):
        raise typer.BadParameter("must be generic or firehose", param_hint="--protocol")
    if access_key_env and protocol != "firehose":
        raise typer.BadParameter("access keys are checked only with --protocol firehose; add it, or drop "
                                 "--access-key-env for the generic receiver", param_hint="--access-key-env")
    if hold_after is not None and protocol != "generic":
        raise typer.BadParameter("only the generic receiver holds requests; drop --protocol firehose, or "
                                 "--hold-after", param_hint="--hold-after")
    if protocol == "firehose":
        from egress.cli.firehose import run_firehose_receiver

        run_firehose_receiver(host=host, port=port, access_key_env=access_key_env or [], record=record,
                              fail_rate=fail_rate, fail_status=fail_status, delay=delay, seed=seed)
        return
    import socket

    from egress.receiver import ReceiverConfig, serve  # aiohttp: only for this command

    verify_keys = _verify_keys(verify_secret)
    config = ReceiverConfig(fail_rate=fail_rate, fail_status=fail_status, delay=delay, fail_first=fail_first,
                            idempotency_header=idempotency_header or (
                                "webhook-id" if verify_secret is not None else "Idempotency-Key"),
                            record=record, seed=seed,
                            hold_after=hold_after, verify_keys=verify_keys, fail_paths=set(fail_path or ()))
    if port == 0:
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]

    async def main() -> None:
        stop = asyncio.Event()
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        server = asyncio.create_task(serve(config, host, port, ready, stop))
        await asyncio.wait({server, asyncio.create_task(ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            await server
        listening = f"egress receiver listening on http://{host}:{port}/ (GET /stats for counts)"
        if output.json:
            output.say(listening, url=f"http://{host}:{port}/")
        else:
            print(listening, flush=True)
        await server

    try:
        asyncio.run(main())
    except OSError as error:
        _fail(cannot_serve(host, port, error))


def _verify_keys(path: Path | None) -> tuple[bytes, ...]:
    """The keys of ``egress receiver --verify-secret FILE`` (none without it)."""
    if path is None:
        return ()
    from egress.errors import SpecError
    from egress.webhook_signatures import read_secrets

    try:
        keys = read_secrets(file=str(path))
    except SpecError as error:
        raise typer.BadParameter(error.message, param_hint="--verify-secret") from None
    for key in keys:
        add_secret("whsec_" + base64.b64encode(key).decode())
    return keys


def command_line(command: str | None = None) -> typer.Typer:
    """The ``egress`` command line: every command, or with ``command`` (a top-level command's name,
    ``run``) that one alone. ``egress run ...`` parses, helps and fails exactly as with every command,
    but imports no other command's module and builds no other command's options (typer reads every
    registered command's signature at each start). Raises ``KeyError`` for an unknown ``command``."""
    if command is not None and command not in COMMANDS:
        raise KeyError(command)
    app = command_group(add_completion=False, no_args_is_help=True, help=HELP)
    app.registered_callback = _own.registered_callback
    for name, (module, attribute) in _IMPORTED_COMMANDS.items():
        if command in (None, name):
            app.command(name=name)(getattr(importlib.import_module(module), attribute))
    app.registered_commands += [info for info in _own.registered_commands if command in (None, info.name)]
    for name, (module, attribute) in _IMPORTED_GROUPS.items():
        if command in (None, name):
            app.add_typer(getattr(importlib.import_module(module), attribute), name=name)
    return app


COMMANDS = frozenset([*_IMPORTED_COMMANDS, *_IMPORTED_GROUPS, *(str(info.name) for info in _own.registered_commands)])
"""The names of the top-level commands."""


def __getattr__(name: str) -> Any:
    """``app``: the whole command line (:func:`command_line`), built on first use (tests invoke it)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()["app"] = command_line()
    return value


if TYPE_CHECKING:
    app: typer.Typer


def main() -> None:
    """The ``egress`` program: ``sys.argv``'s command alone when it names one, else every command
    (``egress --help``, ``egress --version``, a mistyped command)."""
    named = sys.argv[1] if len(sys.argv) > 1 else None
    try:
        command_line(named if named in COMMANDS else None)()
    finally:
        settle_for_exit()  # the process ends: its exit need not traverse every object again


if __name__ == "__main__":
    main()
