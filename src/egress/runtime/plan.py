"""From Spec and DynamicSpec to a checked plan: every reference resolved, every connector's
parameters validated, the process functions imported. All problems are collected and reported
together, each naming its file and path; nothing runs and nothing is written before this passes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import logging
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from egress.connectors import SINKS, SOURCES, Registry
from egress.connectors.base import READERS_LIMIT, reader_count
from egress.errors import SecretUnavailable, SpecError, SpecErrors
from egress.runtime.api import MapFunction, ProcessFunction, map_output_stream
from egress.runtime.lanes import lane, lanes
from egress.secret_references import read_secret, variable
from egress.spec import DynamicSpec, Spec, StreamSpec, load_document, misplaced_fields, validate_model
from egress.spec.problems import fields_of, misplaced_message
from egress.throttler import validate_dynamic_throttlers

logger = logging.getLogger("egress.spec")


@dataclass(frozen=True)
class SourcePlan:
    """A checked source: its class and validated parameters, the stream it writes, and ``readers``,
    how many reader units read it (``source:<id>`` partitions ``0 .. readers-1``; the class decides
    from its parameters, ``egress.connectors.base.reader_count``)."""

    source_id: str
    source_class: Any
    parameters: Any
    stream_id: str
    stream: StreamSpec
    readers: int = 1

    def lane(self, reader: int) -> str:
        """The log stream reader ``reader`` appends to (``egress.runtime.lanes``: the stream id for
        reader 0)."""
        return lane(self.stream_id, reader)

    @property
    def reads(self) -> str:
        """What the source reads, as the Spec names it (a file source's ``path``, the parameters'
        ``reads`` when they define one, e.g. a ``nats`` source's stream; ``""`` for a source without
        either): it scopes the source's message ids and is recorded in the state directory."""
        return str(getattr(self.parameters, "reads", None) or getattr(self.parameters, "path", ""))

    @property
    def reads_parameter(self) -> str:
        """The parameter :attr:`reads` comes from (``path`` unless the parameters name another)."""
        return str(getattr(self.parameters, "reads_parameter", "path"))


@dataclass(frozen=True)
class SinkPlan:
    sink_id: str
    sink_class: Any
    parameters: Any
    dynamic_parameters: Any
    stream_id: str


@dataclass(frozen=True)
class ComputationPlan:
    computation_id: str
    function_class: type[ProcessFunction]
    input_stream_ids: list[str]
    output_stream_ids: list[str]
    sinks: dict[str, SinkPlan]
    logged_streams: frozenset[str]
    """Output streams other computations read: appended to the log as well as the outbox."""
    parameters: Any
    """Static ``processing_function_parameters``: the function's ``parameters_model`` or a dict."""
    dynamic_parameters: Any = None
    """Dynamic ``processing_function_parameters`` (DynamicSpec): ``dynamic_parameters_model`` or a dict."""
    input_lanes: dict[str, str] = field(default_factory=dict)
    """The log streams the job reads, each lane → the input stream it is a lane of
    (``egress.runtime.lanes``), in the order of ``input_stream_ids`` and, within a stream, of its
    readers; empty at construction means one lane per input stream, the stream itself."""

    def __post_init__(self) -> None:
        if not self.input_lanes:
            self.input_lanes.update((stream, stream) for stream in self.input_stream_ids)


@dataclass(frozen=True)
class Plan:
    spec: Spec
    dynamic_spec: DynamicSpec
    base_dir: Path
    spec_file: str | None
    dynamic_spec_file: str | None
    sources: dict[str, SourcePlan] = field(default_factory=dict)
    computations: dict[str, ComputationPlan] = field(default_factory=dict)

    @property
    def streams(self) -> dict[str, StreamSpec]:
        return self.spec.streams

    def stream_of(self, log_stream: str) -> str:
        """The stream a log stream holds: the stream whose lane it is (``egress.runtime.lanes``), else
        itself. What a message, a status line or an error shows is the stream, never a lane."""
        return self._lane_streams.get(log_stream, log_stream)

    @functools.cached_property
    def _lane_streams(self) -> dict[str, str]:
        """Every lane after a source's first (reader 1 on) → its stream, built once per plan."""
        return {source.lane(reader): source.stream_id
                for source in self.sources.values() for reader in range(1, source.readers)}


def load_plan(spec_path: str | Path, dynamic_spec_path: str | Path | None = None) -> Plan:
    """Load both files and build the plan; raises :class:`SpecError` (often :class:`SpecErrors`)."""
    spec, dynamic = load_specs(spec_path, dynamic_spec_path)
    return build_plan(spec, dynamic, base_dir=Path(spec_path).resolve().parent, spec_file=str(spec_path),
                      dynamic_spec_file=None if dynamic_spec_path is None else str(dynamic_spec_path))


def load_specs(spec_path: str | Path, dynamic_spec_path: str | Path | None = None) -> tuple[Spec, DynamicSpec]:
    """The Spec and the DynamicSpec (empty without a file), each validated as a document only;
    raises :class:`SpecError` (often :class:`SpecErrors`) naming the file."""
    document = load_document(spec_path)
    spec = validate_model(Spec, document, file=str(spec_path), placement=_placement(document, in_dynamic=False))
    if dynamic_spec_path is None:
        return spec, DynamicSpec()
    return spec, validate_dynamic_spec(load_document(dynamic_spec_path), document, file=str(dynamic_spec_path))


def validate_dynamic_spec(data: Any, spec_document: dict[str, Any], *, file: str | None) -> DynamicSpec:
    """``data`` validated as the DynamicSpec of the Spec ``spec_document`` (plain data, as loaded or
    ``Spec.model_dump(by_alias=True)``), which names the sink classes whose parameters a misplaced
    field is looked up in; raises :class:`SpecErrors` naming ``file``."""
    return validate_model(DynamicSpec, data, file=file, placement=_placement(spec_document, in_dynamic=True))


def _placement(spec_document: dict[str, Any], *, in_dynamic: bool) -> Callable[[tuple[str, ...]], str | None]:
    """``validate_model``'s ``placement`` for the Spec (or, ``in_dynamic``, the DynamicSpec): an
    unknown field written directly under ``computations/<c>/sinks/<s>``, ``computations/<c>`` or at
    the top level that is a parameter of that sink's class (the Spec's ``spec_document`` names it),
    of a sink of the computation (of any computation, at the top level), or of its process
    function, is said to belong under that ``parameters`` (in the other file when it is the other
    file's)."""
    computations = _mapping(spec_document.get("computations"))

    def placed(loc: tuple[str, ...]) -> str | None:
        name = loc[-1]
        if len(loc) == 1:
            return next((found for computation_id in computations
                         if (found := _computation_parameter(computations, computation_id, None, name, in_dynamic))
                         is not None), None)
        if len(loc) == 5 and loc[:3:2] == ("computations", "sinks"):
            return _computation_parameter(computations, loc[1], loc[3], name, in_dynamic)
        if len(loc) == 3 and loc[0] == "computations":
            return _computation_parameter(computations, loc[1], None, name, in_dynamic)
        return None
    return placed


def _computation_parameter(computations: dict[str, Any], computation_id: str, sink_id: str | None, name: str,
                           in_dynamic: bool) -> str | None:
    """Where ``name`` belongs when it is a parameter of the sink ``sink_id`` of the computation
    ``computation_id`` (of the Spec's ``computations``), or, for ``None``, of its process function
    or of any of its sinks; ``None`` when it is none of theirs."""
    computation = _mapping(computations.get(computation_id))
    sinks = _mapping(computation.get("sinks"))
    if sink_id is None:
        found = _function_parameter(computation, name, f"computations/{computation_id}", in_dynamic)
        if found is not None:
            return found
    for each in list(sinks) if sink_id is None else [sink_id]:
        try:
            sink_class = SINKS.get(str(_mapping(sinks.get(each)).get("sink_class_name")))
        except KeyError:
            continue
        found = _belongs(name, f"computations/{computation_id}/sinks/{each}/parameters",
                         sink_class.parameters_model, sink_class.dynamic_parameters_model, in_dynamic)
        if found is not None:
            return found
    return None


def _function_parameter(computation: dict[str, Any], name: str, at: str, in_dynamic: bool) -> str | None:
    """Where ``name`` belongs when it is a parameter of the computation's process function (imported
    only for this question; a function that does not import is reported by :func:`build_plan`)."""
    reference = computation.get("processing_function")
    if not isinstance(reference, str) or ":" not in reference:
        return None
    errors: list[SpecError] = []
    function_class = _import_function(reference.strip(), "", None, errors)
    if function_class is None:
        return None
    return _belongs(name, f"{at}/processing_function_parameters", function_class.parameters_model,
                    function_class.dynamic_parameters_model, in_dynamic)


def _belongs(name: str, at: str, static: type[BaseModel] | None, dynamic: type[BaseModel] | None,
             in_dynamic: bool) -> str | None:
    """The message for ``name`` written beside ``at`` (a ``parameters`` map) when one of the two
    parameter models has it, else ``None``."""
    for model, model_is_dynamic in ((static, False), (dynamic, True)):
        if model is not None and name in fields_of(model):
            if model_is_dynamic == in_dynamic:
                return f"{name} belongs under {at}"
            return misplaced_message(name, at, belongs_in_dynamic=model_is_dynamic)
    return None


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def build_plan(
    spec: Spec,
    dynamic: DynamicSpec,
    *,
    base_dir: Path,
    spec_file: str | None = None,
    dynamic_spec_file: str | None = None,
) -> Plan:
    """Check ``spec`` and ``dynamic`` together and resolve them; raises :class:`SpecErrors` with
    every problem found, each naming its file and path."""
    builder = _PlanBuilder(spec, dynamic, base_dir, spec_file, dynamic_spec_file)
    builder.check_group_by()
    sources = builder.sources()
    builder.check_lanes(sources)
    computations = builder.computations(stream_lanes(sources))
    builder.check_dynamic_computations()
    builder.check_throttlers(computations)
    if builder.errors:
        raise SpecErrors(builder.errors)
    return Plan(spec, dynamic, base_dir, spec_file, dynamic_spec_file, sources, computations)


class _PlanBuilder:
    """:func:`build_plan`'s steps, each collecting its problems into :attr:`errors`."""

    def __init__(self, spec: Spec, dynamic: DynamicSpec, base_dir: Path, spec_file: str | None,
                 dynamic_spec_file: str | None) -> None:
        self.spec = spec
        self.dynamic = dynamic
        self.base_dir = base_dir
        self.spec_file = spec_file
        self.dynamic_spec_file = dynamic_spec_file
        self.errors: list[SpecError] = []

    def problem(self, message: str, path: str) -> None:
        """A problem at ``path`` of the Spec file."""
        self.errors.append(SpecError(message, path=path, file=self.spec_file))

    def dynamic_problem(self, message: str, path: str) -> None:
        """A problem at ``path`` of the DynamicSpec file."""
        self.errors.append(SpecError(message, path=path, file=self.dynamic_spec_file))

    def known_stream(self, stream_id: str, path: str) -> bool:
        if stream_id in self.spec.streams:
            return True
        self.problem(_unknown_stream(self.spec, stream_id), path)
        return False

    def registered(self, registry: Registry, name: str, path: str) -> Any:
        """The connector class called ``name``, or ``None`` with Flow's message reported at ``path``."""
        try:
            return registry.get(name)
        except KeyError as error:
            self.problem(str(error.args[0]), path)
            return None

    def check_group_by(self) -> None:
        """Every ``group_by`` column is in its stream's schema."""
        for stream_id, stream in self.spec.streams.items():
            for i, column in enumerate(stream.group_by):
                if stream.column(column) is None:
                    self.problem(f'group_by column "{column}" is not in the schema',
                                 f"streams/{stream_id}/group_by/{i}")

    def sources(self) -> dict[str, SourcePlan]:
        """The plan of every source whose class, stream and parameters check out."""
        sources: dict[str, SourcePlan] = {}
        for source_id, source in self.spec.sources.items():
            at = f"sources/{source_id}"
            source_class = self.registered(SOURCES, source.source_class_name, f"{at}/source_class_name")
            if source_class is None or not self.known_stream(source.output_stream_id, f"{at}/output_stream_id"):
                continue
            stream = self.spec.streams[source.output_stream_id]
            parameters = _parameters(source_class.parameters_model, source.parameters, self.spec_file,
                                     f"{at}/parameters", self.errors)
            if parameters is None:
                continue
            self.errors.extend(e.at(file=self.spec_file, prefix=at)
                               for e in source_class.check(parameters, stream, self.base_dir))
            self.errors.extend(unset_environment(source.parameters, f"{at}/parameters", self.spec_file))
            readers = reader_count(source_class, parameters)
            if not 1 <= readers <= READERS_LIMIT:
                self.problem(f"a source has 1 to {READERS_LIMIT} readers, not {readers}", f"{at}/parameters/readers")
                continue
            sources[source_id] = SourcePlan(source_id, source_class, parameters, source.output_stream_id, stream,
                                            readers)
        return sources

    def check_lanes(self, sources: dict[str, SourcePlan]) -> None:
        """No lane of a source's stream (``egress.runtime.lanes``) is the id of another stream: the
        two would share one log stream."""
        for source in sources.values():
            for reader in range(1, source.readers):
                name = source.lane(reader)
                if name in self.spec.streams:
                    self.problem(f'reader {reader} of this source writes the log stream "{name}" (its lane of stream '
                                 f'"{source.stream_id}"), which is the id of another stream: rename that stream or '
                                 f"give the source at most {reader} readers",
                                 f"sources/{source.source_id}/parameters/readers")
                    break

    def computations(self, stream_lanes: dict[str, list[str]]) -> dict[str, ComputationPlan]:
        """The plan of every computation whose process function imports; ``stream_lanes``: the lanes
        of each stream some source's readers write (:func:`stream_lanes`)."""
        spec = self.spec
        consumed = {s for c in spec.computations.values() for s in c.input_stream_ids}
        produced = {s.output_stream_id for s in spec.sources.values()} | {
            s for c in spec.computations.values() for s in c.output_stream_ids}
        computations: dict[str, ComputationPlan] = {}
        for computation_id in spec.computations:
            planned = self.computation(computation_id, consumed, produced, stream_lanes)
            if planned is not None:
                computations[computation_id] = planned
        return computations

    def computation(self, computation_id: str, consumed: set[str], produced: set[str],
                    stream_lanes: dict[str, list[str]]) -> ComputationPlan | None:
        """Computation ``computation_id``'s plan: its streams checked (an input must have a producer),
        its sinks and function parameters validated; ``None`` when its function does not import."""
        computation = self.spec.computations[computation_id]
        at = f"computations/{computation_id}"
        for i, stream_id in enumerate(computation.input_stream_ids):
            if self.known_stream(stream_id, f"{at}/input_stream_ids/{i}") and stream_id not in produced:
                self.problem(f'stream "{stream_id}" has no producer: no source or computation outputs it',
                             f"{at}/input_stream_ids/{i}")
        for i, stream_id in enumerate(computation.output_stream_ids):
            self.known_stream(stream_id, f"{at}/output_stream_ids/{i}")
        function_class = _import_function(computation.processing_function, f"{at}/processing_function",
                                          self.spec_file, self.errors)
        sinks: dict[str, SinkPlan] = {}
        for sink_id in computation.sinks:
            sink_plan = _sink_plan(self.spec, self.dynamic, computation_id, sink_id, self.spec_file,
                                   self.dynamic_spec_file, self.errors, base_dir=self.base_dir)
            if sink_plan is not None:
                sinks[sink_id] = sink_plan
        if function_class is None:
            return None
        if issubclass(function_class, MapFunction):
            try:
                map_output_stream(function_class, list(computation.output_stream_ids))
            except ValueError as error:
                self.problem(str(error), f"{at}/processing_function")
        static_model, dynamic_model = function_class.parameters_model, function_class.dynamic_parameters_model
        static_parameters = _parameters_or_dict(
            static_model, computation.processing_function_parameters, self.spec_file,
            f"{at}/processing_function_parameters", self.errors, dynamic_model, other_is_dynamic=True)
        dynamic_entry = self.dynamic.computations.get(computation_id)
        dynamic_function_parameters = _parameters_or_dict(
            dynamic_model, dynamic_entry.processing_function_parameters if dynamic_entry else {},
            self.dynamic_spec_file, f"{at}/processing_function_parameters", self.errors, static_model)
        return ComputationPlan(
            computation_id,
            function_class,
            list(computation.input_stream_ids),
            list(computation.output_stream_ids),
            sinks,
            frozenset(s for s in computation.output_stream_ids if s in consumed),
            static_parameters,
            dynamic_function_parameters,
            {name: stream for stream in computation.input_stream_ids for name in stream_lanes.get(stream, [stream])},
        )

    def check_dynamic_computations(self) -> None:
        """Every computation and sink the DynamicSpec configures is in the Spec."""
        for computation_id, entry in self.dynamic.computations.items():
            at = f"computations/{computation_id}"
            if computation_id not in self.spec.computations:
                self.dynamic_problem(f'unknown computation "{computation_id}": the Spec has no such computation', at)
                continue
            for sink_id in entry.sinks:
                if sink_id not in self.spec.computations[computation_id].sinks:
                    self.dynamic_problem(f'unknown sink "{sink_id}": computation "{computation_id}" has no such sink',
                                         f"{at}/sinks/{sink_id}")

    def check_throttlers(self, computations: dict[str, ComputationPlan]) -> None:
        """The DynamicSpec's throttlers are valid and every sink's ``throttler_id`` names one."""
        throttlers: dict[str, Any] = {}
        try:
            throttlers = validate_dynamic_throttlers(self.dynamic, file=self.dynamic_spec_file)
        except SpecErrors as found:
            self.errors.extend(found.errors)
            throttlers = dict(self.dynamic.throttlers)  # declared, if wrong: a sink naming one is not a problem too
        for planned in computations.values():
            for sink_plan in planned.sinks.values():
                self.errors.extend(_throttler_problems(planned.computation_id, sink_plan, throttlers, self.spec_file))


def stream_lanes(sources: dict[str, SourcePlan]) -> dict[str, list[str]]:
    """The lanes of each stream the sources write: as many as the most readers of a source writing it
    (two sources with several readers writing one stream share its lanes: reader ``k`` of each writes
    lane ``k``)."""
    writers: dict[str, int] = {}
    for source in sources.values():
        writers[source.stream_id] = max(writers.get(source.stream_id, 1), source.readers)
    return {stream: lanes(stream, count) for stream, count in writers.items()}


def build_sink_plan(
    spec: Spec,
    dynamic: DynamicSpec,
    computation_id: str,
    sink_id: str,
    *,
    spec_file: str | None = None,
    dynamic_spec_file: str | None = None,
    parameter_overrides: dict[str, Any] | None = None,
) -> SinkPlan:
    """The sink ``sink_id`` of computation ``computation_id`` (both in ``spec``), built and checked
    alone, as :func:`build_plan` builds each sink: its class, the streams it reads, its static
    parameters (``parameter_overrides`` replacing fields of the Spec's) and dynamic parameters, and
    its throttler in ``dynamic``. Nothing else of the Spec is checked and no process function is
    imported (``egress redrive`` needs only the sink). A relative path starts at the folder of
    ``spec_file`` (the current folder without one). Raises :class:`SpecErrors`."""
    errors: list[SpecError] = []
    base_dir = Path(spec_file).resolve().parent if spec_file is not None else Path.cwd()
    sink_plan = _sink_plan(spec, dynamic, computation_id, sink_id, spec_file, dynamic_spec_file, errors,
                           parameter_overrides or {}, base_dir=base_dir)
    if sink_plan is not None:
        try:
            throttlers = validate_dynamic_throttlers(dynamic, file=dynamic_spec_file)
        except SpecErrors as found:
            errors.extend(found.errors)
        else:
            errors.extend(_throttler_problems(computation_id, sink_plan, throttlers, spec_file))
    if errors or sink_plan is None:
        raise SpecErrors(errors)
    return sink_plan


def _sink_plan(
    spec: Spec, dynamic: DynamicSpec, computation_id: str, sink_id: str, spec_file: str | None,
    dynamic_spec_file: str | None, errors: list[SpecError], parameter_overrides: dict[str, Any] | None = None,
    *, base_dir: Path,
) -> SinkPlan | None:
    """One sink checked and resolved, or ``None`` with its problems appended to ``errors``; its
    relative file paths are made to start at ``base_dir`` (the Spec's folder)."""
    computation = spec.computations[computation_id]
    sink = computation.sinks[sink_id]
    sink_at = f"computations/{computation_id}/sinks/{sink_id}"
    try:
        sink_class = SINKS.get(sink.sink_class_name)
    except KeyError as error:
        errors.append(SpecError(str(error.args[0]), path=f"{sink_at}/sink_class_name", file=spec_file))
        return None
    inputs: dict[str, StreamSpec] = {}
    for i, stream_id in enumerate(sink.input_stream_ids):
        at = f"{sink_at}/input_stream_ids/{i}"
        if stream_id not in spec.streams:
            errors.append(SpecError(_unknown_stream(spec, stream_id), path=at, file=spec_file))
        elif stream_id not in computation.output_stream_ids:
            errors.append(SpecError(f'stream "{stream_id}" is not an output stream of computation '
                                    f'"{computation_id}"', path=at, file=spec_file))
        else:
            inputs[stream_id] = spec.streams[stream_id]
    static_model, dynamic_model = sink_class.parameters_model, sink_class.dynamic_parameters_model
    parameters = _parameters(static_model, {**sink.parameters, **(parameter_overrides or {})},
                             spec_file, f"{sink_at}/parameters", errors, dynamic_model, other_is_dynamic=True)
    dynamic_parameters = _parameters(dynamic_model, dynamic.sink_parameters(computation_id, sink_id),
                                     dynamic_spec_file, f"{sink_at}/parameters", errors, static_model)
    if parameters is None or dynamic_parameters is None or len(inputs) != len(sink.input_stream_ids):
        return None
    parameters = _files_in(base_dir, parameters, f"{computation_id}/{sink_id}", spec_file)
    files_in = getattr(dynamic_parameters, "files_in", None)  # files the DynamicSpec names (webhook secrets)
    if files_in is not None:
        try:
            dynamic_parameters = files_in(base_dir)
        except SpecErrors as found:
            errors.extend(e.at(file=dynamic_spec_file, prefix=f"{sink_at}/parameters") for e in found.errors)
            return None
    construction = sink_class.check(parameters, inputs)
    errors.extend(unset_environment(sink.parameters, f"{sink_at}/parameters", spec_file))
    errors.extend(e.at(file=spec_file, prefix=sink_at) for e in construction)
    if construction:
        return None
    return SinkPlan(sink_id, sink_class, parameters, dynamic_parameters, sink.input_stream_ids[0])


SINK_FILES = ("dead_letter_path", "error_output", "tls_ca_file")
"""The sink parameters that name a file: a relative one starts at the Spec's folder (so does an
``access_key: {file: PATH}``)."""
WRITTEN_SINK_FILES = ("dead_letter_path", "error_output")


def _files_in(base_dir: Path, parameters: Any, sink: str, spec_file: str | None) -> Any:
    """``parameters`` with each relative file of :data:`SINK_FILES` joined to ``base_dir``: as a
    source's paths, a sink's start at the Spec's folder, whatever folder egress runs in. Where a
    file egress writes (:data:`WRITTEN_SINK_FILES`) exists only at the current folder (an egress
    that started relative paths there wrote it), a warning names both and the redrive of the
    earlier letters of ``sink`` (``COMPUTATION/SINK``)."""
    update: dict[str, Any] = {}
    key: Any = getattr(parameters, "access_key", None)
    key_file = getattr(key, "file", None)
    if key_file is not None and not Path(key_file).is_absolute():
        update["access_key"] = key.model_copy(update={"file": str(base_dir / key_file)})
    for name in SINK_FILES:
        path = getattr(parameters, name, None)
        if path is None or Path(path).is_absolute():
            continue
        update[name] = str(base_dir / path)
        earlier = Path(path).absolute()
        if name in WRITTEN_SINK_FILES and earlier != base_dir / path and earlier.is_file() \
                and not (base_dir / path).exists():
            logger.warning("%s: computations/%s/parameters/%s: a relative path starts at the Spec's folder: the sink "
                           "now writes %s; the earlier lines in %s stay there%s", spec_file or "Spec",
                           sink.replace("/", "/sinks/"), name, base_dir / path, earlier,
                           f": egress redrive {earlier} {spec_file or 'SPEC'} --sink {sink}"
                           if name == "dead_letter_path" else "")
    return parameters.model_copy(update=update) if update else parameters


def unset_environment(parameters: Any, at: str, spec_file: str | None) -> list[SpecError]:
    """A problem for each ``*_env`` key in ``parameters`` (a connector's parameters as the Spec
    gives them, nested dicts and lists; ``at`` their Spec path) naming an environment variable that
    is not set or empty: a secret given by reference must be there before anything runs, so
    ``egress validate`` and ``egress run`` refuse it alike, naming the key and the variable."""
    found: list[SpecError] = []
    items = parameters.items() if isinstance(parameters, dict) else enumerate(parameters) \
        if isinstance(parameters, list) else ()
    for key, value in items:
        if isinstance(value, dict | list):
            found += unset_environment(value, f"{at}/{key}", spec_file)
        elif isinstance(key, str) and key.endswith("_env") and isinstance(value, str) and not _set(value):
            found.append(SpecError(f"{variable(value)} is not set or empty: export it before egress run",
                                   path=f"{at}/{key}", file=spec_file))
    return found


def _set(variable: str) -> bool:
    """The environment ``variable`` is set and not empty."""
    with contextlib.suppress(SecretUnavailable):
        return bool(read_secret(env=variable))
    return False


def _unknown_stream(spec: Spec, stream_id: str) -> str:
    return f'unknown stream id "{stream_id}" (the Spec declares: {", ".join(sorted(spec.streams))})'


def _throttler_problems(computation_id: str, sink_plan: SinkPlan, throttlers: dict[str, Any],
                        spec_file: str | None) -> list[SpecError]:
    """The sink's ``throttler_id`` must name a throttler of the DynamicSpec."""
    throttler_id = getattr(sink_plan.parameters, "throttler_id", None)
    if throttler_id is None or throttler_id in throttlers:
        return []
    return [SpecError(f'Throttler "{throttler_id}" is not configured: declare it under throttlers in the DynamicSpec',
                      path=f"computations/{computation_id}/sinks/{sink_plan.sink_id}/parameters/throttler_id",
                      file=spec_file)]


def _parameters(
    model: type[BaseModel], data: Any, file: str | None, prefix: str, errors: list[SpecError],
    other: type[BaseModel] | None = None, *, other_is_dynamic: bool = False,
) -> Any:
    """``data`` validated as ``model`` at ``prefix`` of ``file``, or ``None`` with its problems put
    in ``errors``; a field of ``other`` (the counterpart parameters of the other file) in ``data``
    is reported as belonging there."""
    elsewhere = misplaced_fields(model, other, prefix, other_is_dynamic=other_is_dynamic) if other else None
    try:
        return validate_model(model, data, file=file, prefix=prefix, elsewhere=elsewhere)
    except SpecErrors as found:
        errors.extend(found.errors)
        return None


def _parameters_or_dict(
    model: type[BaseModel] | None, data: dict[str, Any], file: str | None, prefix: str, errors: list[SpecError],
    other: type[BaseModel] | None = None, *, other_is_dynamic: bool = False,
) -> Any:
    return dict(data) if model is None else _parameters(model, data, file, prefix, errors, other,
                                                         other_is_dynamic=other_is_dynamic)


def validate_function_parameters(
    function_class: type[ProcessFunction], data: dict[str, Any], *, dynamic: bool, file: str | None = None,
    prefix: str = "",
) -> Any:
    """``data`` as the function's (dynamic) parameters model, or a dict when it declares none;
    raises :class:`SpecErrors` naming ``prefix/<field>``."""
    model = function_class.dynamic_parameters_model if dynamic else function_class.parameters_model
    return dict(data) if model is None else validate_model(model, data, file=file, prefix=prefix)


def _import_problem(module_name: str, error: Exception) -> str:
    """Why importing ``module_name`` failed: the module (or a package above it) is not on the
    import path, or it was found and its own code failed (a SyntaxError at a file and line, a
    missing dependency, an exception raised at import), which no change of folder fixes."""
    missing = error.name if isinstance(error, ModuleNotFoundError) else None
    if missing is not None and (module_name == missing or module_name.startswith(f"{missing}.")):
        return (f'cannot import module "{module_name}" ({type(error).__name__}: {error}); run egress from the '
                "folder that contains the package, or install it")
    if isinstance(error, SyntaxError):
        return (f'module "{module_name}" has a syntax error: {error.msg} at {error.filename}:{error.lineno}; '
                "fix the file")
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen")]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    fix = _missing_module_fix(missing) if missing is not None else ""
    return f'importing module "{module_name}" failed: {type(error).__name__}: {error}{where}{fix}'


def _missing_module_fix(missing: str) -> str:
    """The fix for an import of ``missing`` in user code that failed: install its top-level package
    when that is what is missing, else the package is there and lacks the submodule."""
    top = missing.partition(".")[0]
    try:
        top_found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        top_found = False
    if top == missing or not top_found:
        return f"; install {top} or remove the import"
    parent, _, sub = missing.rpartition(".")
    return f"; module {parent} (installed) has no submodule {sub}: correct the import or remove it"


def _import_function(
    reference: str, path: str, file: str | None, errors: list[SpecError]
) -> type[ProcessFunction] | None:
    """Import ``package.module:ClassName`` (the current directory is on the import path)."""
    module_name, _, class_name = reference.partition(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any import-time failure of user code is a spec problem here
        errors.append(SpecError(_import_problem(module_name, error), path=path, file=file))
        return None
    found = getattr(module, class_name, None)
    if found is None:
        errors.append(SpecError(f'module "{module_name}" has no class "{class_name}"', path=path, file=file))
        return None
    if not (isinstance(found, type) and issubclass(found, ProcessFunction)):
        errors.append(SpecError(f'"{reference}" is not a subclass of egress.ProcessFunction', path=path, file=file))
        return None
    problem = _construction_problem(found)
    if problem is not None:
        errors.append(SpecError(problem, path=path, file=file))
        return None
    return found


def _construction_problem(function_class: type[ProcessFunction]) -> str | None:
    """Why egress could not construct ``function_class`` as each partition job does (with no
    arguments; parameters reach the function through ``init``'s context), else ``None``. The
    signature is checked, not called: constructing here would run user code at validation."""
    try:
        inspect.signature(function_class).bind()
    except TypeError as error:
        source = inspect.getsourcefile(function_class) or "?"
        return (f'class {function_class.__name__} ({source}) cannot be constructed as egress does, with no '
                f"arguments: {error}; give its __init__ parameters defaults, or take them as "
                "processing_function_parameters (ctx.parameters in init)")
    except ValueError:  # no signature to inspect (a class implemented in C): constructing will tell
        return None
    return None
