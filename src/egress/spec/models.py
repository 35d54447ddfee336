"""Spec and DynamicSpec: the pydantic models of a pipeline, in Flow's shape and names.

A Spec is static (changing it needs a pipeline stop); a DynamicSpec holds what is applied live
(sink retry parameters, processing function parameters, throttlers). Connector parameters stay
``dict`` here: each connector validates its own through the registry (``egress.runtime.plan``),
so that the error path still reads ``computations/<c>/sinks/<s>/parameters/<name>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from egress.errors import SHOWN_PROBLEMS, SpecErrors
from egress.spec.loader import load_document
from egress.spec.problems import (
    close_match,
    drop_misspelled_missing,
    fields_of,
    misplaced_message,
    model_at,
    to_spec_error,
)

PROCESS_FUNCTION_COMPUTATION = "NYT::NFlow::TProcessFunctionComputation"
COMPUTATION_CLASS_ALIASES = {PROCESS_FUNCTION_COMPUTATION: PROCESS_FUNCTION_COMPUTATION,
                             "process_function": PROCESS_FUNCTION_COMPUTATION}

ColumnType = Literal["string", "int64", "double", "boolean"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Column(_Strict):
    """One column of a stream schema; ``required=False`` (the default, as in YT) allows null."""

    name: str = Field(min_length=1)
    type: ColumnType
    required: bool = False


class StreamSpec(_Strict):
    """A stream: its row schema and the columns whose values form the key (``group_by``)."""

    columns: list[Column] = Field(alias="schema", min_length=1, description="the columns, each a map with name "
                                  "and type")
    group_by: list[str] = Field(default=[], description="the names of the columns whose values form the key")

    @field_validator("columns")
    @classmethod
    def _distinct_names(cls, columns: list[Column]) -> list[Column]:
        """A row is a map by column name: a second column of one name would silently take the first's value."""
        first: dict[str, int] = {}
        for i, column in enumerate(columns):
            if column.name in first:
                raise ValueError(f'column "{column.name}" is named twice (schema/{first[column.name]} and '
                                 f"schema/{i}): rename or remove one")
            first[column.name] = i
        return columns

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)


class SourceSpec(_Strict):
    """A source feeding ``output_stream_id``; ``parameters`` are checked by the source class."""

    source_class_name: str
    output_stream_id: str
    parameters: dict[str, Any] = {}


class SinkSpec(_Strict):
    """A sink inside a computation, reading some of the computation's output streams."""

    sink_class_name: str
    input_stream_ids: list[str] = []
    parameters: dict[str, Any] = {}


class ComputationSpec(_Strict):
    """A computation: a process function over its input streams, with sinks on its outputs."""

    computation_class_name: str = PROCESS_FUNCTION_COMPUTATION
    processing_function: str
    input_stream_ids: list[str] = Field(min_length=1, description="the ids of the streams it reads")
    output_stream_ids: list[str] = Field(default=[], description="the ids of the streams it writes")
    sinks: dict[str, SinkSpec] = {}
    processing_function_parameters: dict[str, Any] = {}

    @field_validator("computation_class_name")
    @classmethod
    def _known_class(cls, value: str) -> str:
        if value not in COMPUTATION_CLASS_ALIASES:
            raise ValueError(f'No computation class "{value}" is registered; registered: '
                             f'{", ".join(sorted(COMPUTATION_CLASS_ALIASES))}')
        return COMPUTATION_CLASS_ALIASES[value]

    @field_validator("processing_function")
    @classmethod
    def _reference(cls, value: str) -> str:
        if value != value.strip():
            side = ("a trailing" if value == value.lstrip() else "a leading" if value == value.rstrip()
                    else "a leading and a trailing")
            raise ValueError(f"{value!r} has {side} space: remove it")
        module, _, name = value.partition(":")
        if not module or not name:
            raise ValueError(f"expected package.module:ClassName, got {value!r}")
        return value


class Spec(_Strict):
    """The static description of a pipeline (Flow's ``Spec``)."""

    pipeline: str = Field(min_length=1, description="the pipeline's name")
    partition_count: int = Field(default=1, ge=1, le=4096, description="the number of partitions of the computation")
    streams: dict[str, StreamSpec]
    sources: dict[str, SourceSpec] = {}
    computations: dict[str, ComputationSpec] = {}


class DynamicSinkSpec(_Strict):
    parameters: dict[str, Any] = {}


class DynamicComputationSpec(_Strict):
    sinks: dict[str, DynamicSinkSpec] = {}
    processing_function_parameters: dict[str, Any] = {}
    input_rows_throttler_id: str | None = None
    input_rows_throttler_class_id: str | None = None
    input_bytes_throttler_id: str | None = None
    input_bytes_throttler_class_id: str | None = None


class DynamicSpec(_Strict):
    """What changes without a restart (Flow's ``DynamicSpec``)."""

    computations: dict[str, DynamicComputationSpec] = {}
    throttlers: dict[str, Any] = {}

    def sink_parameters(self, computation: str, sink: str) -> dict[str, Any]:
        """The dynamic parameters given for one sink (``{}`` when none)."""
        found = self.computations.get(computation)
        entry = found.sinks.get(sink) if found else None
        return dict(entry.parameters) if entry else {}


Model = TypeVar("Model", bound=BaseModel)

_OTHER_FILE: dict[type[BaseModel], tuple[type[BaseModel], bool]] = {
    Spec: (DynamicSpec, True), ComputationSpec: (DynamicComputationSpec, True), SinkSpec: (DynamicSinkSpec, True),
    DynamicSpec: (Spec, False), DynamicComputationSpec: (ComputationSpec, False), DynamicSinkSpec: (SinkSpec, False),
}
"""Each Spec model's counterpart in the other file, and whether that counterpart is the DynamicSpec's."""


def validate_model(model: type[Model], data: Any, *, file: str | None = None, prefix: str = "",
                   elsewhere: Mapping[str, str] | None = None,
                   placement: Callable[[tuple[str, ...]], str | None] | None = None) -> Model:
    """Validate ``data`` as ``model``; raises :class:`SpecErrors` with one path-named entry per problem.

    ``elsewhere`` maps names that are not fields of ``model`` but of its counterpart in the other
    file (a connector's dynamic parameters for its static ones) to the message saying where they
    go (:func:`misplaced_fields`); the Spec's and DynamicSpec's own models know theirs. ``placement``
    is asked about every other unknown field, with its ``loc`` (the field's name last), for the
    message saying where it belongs (a connector's parameter written beside ``parameters``), and
    answers ``None`` when it does not know the field."""
    try:
        # Strict: a run must not find out later that ``"4"`` or ``true`` stood where a number belongs.
        return model.model_validate(data, strict=True)
    except ValidationError as error:
        found = drop_misspelled_missing(error.errors(include_url=False), model, examined=SHOWN_PROBLEMS)
        # Only the problems SpecErrors shows are worth a "did you mean" or a placement (difflib and
        # the connector look-ups cost tens of µs each); the rest are counted, in plain words.
        raise SpecErrors([to_spec_error(e, file, prefix, model, _misplaced(model, e, prefix, elsewhere or {})
                                        or _placed(e, placement)) for e in found[:SHOWN_PROBLEMS]]
                         + [to_spec_error(e, file, prefix) for e in found[SHOWN_PROBLEMS:]]) from None


def _placed(error: Any, placement: Callable[[tuple[str, ...]], str | None] | None) -> str | None:
    if placement is None or error["type"] != "extra_forbidden" or not error["loc"]:
        return None
    return placement(tuple(str(part) for part in error["loc"]))


def misplaced_fields(model: type[BaseModel], other: type[BaseModel], at: str, *,
                     other_is_dynamic: bool) -> dict[str, str]:
    """For each field of ``other`` that ``model`` lacks, the message saying that it belongs under
    ``at`` in the other file (the DynamicSpec when ``other_is_dynamic``): ``validate_model``'s
    ``elsewhere``."""
    own = fields_of(model)
    return {name: misplaced_message(name, at, belongs_in_dynamic=other_is_dynamic)
            for name in fields_of(other) if name not in own}


def _misplaced(model: type[BaseModel], error: Any, prefix: str, elsewhere: Mapping[str, str]) -> str | None:
    """The message for an unknown field that is a field of the other file, else ``None``."""
    loc = tuple(error["loc"])
    if error["type"] != "extra_forbidden" or not loc:
        return None
    name = str(loc[-1])
    if len(loc) == 1 and name in elsewhere:
        return elsewhere[name]
    if len(loc) == 1 and not close_match(name, list(fields_of(model))):
        other_name = close_match(name, list(elsewhere))
        if other_name is not None:  # misspelled, and in the wrong file too
            return f"unknown field; did you mean {other_name!r}? {elsewhere[other_name]}"
    owner = model_at(model, loc[:-1])
    other, dynamic = _OTHER_FILE.get(owner, (None, False)) if owner is not None else (None, False)
    if other is None or name not in fields_of(other):
        return None
    at = "/".join(str(part) for part in (prefix, *loc[:-1]) if part != "")
    return misplaced_message(name, at, belongs_in_dynamic=dynamic)


def load_spec(path: str | Path) -> Spec:
    """Load and validate a Spec file (``.yson``, ``.yaml``, ``.json``); raises :class:`SpecError`."""
    return validate_model(Spec, load_document(path), file=str(path))


def load_dynamic_spec(path: str | Path | None) -> DynamicSpec:
    """Load a DynamicSpec file, or return the empty DynamicSpec when ``path`` is ``None``."""
    if path is None:
        return DynamicSpec()
    return validate_model(DynamicSpec, load_document(path), file=str(path))
