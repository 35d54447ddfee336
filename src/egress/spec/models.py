"""Spec and DynamicSpec: the pydantic models of a pipeline, in Flow's shape and names.

A Spec is static (changing it needs a pipeline stop); a DynamicSpec holds what is applied live
(sink retry parameters, processing function parameters, throttlers). Connector parameters stay
``dict`` here: each connector validates its own through the registry (``egress.runtime.plan``),
so that the error path still reads ``computations/<c>/sinks/<s>/parameters/<name>``.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from egress.errors import SpecError, SpecErrors
from egress.spec.loader import load_document

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

    columns: list[Column] = Field(alias="schema", min_length=1)
    group_by: list[str] = []

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
    input_stream_ids: list[str] = Field(min_length=1)
    output_stream_ids: list[str] = []
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
        module, _, name = value.partition(":")
        if not module or not name:
            raise ValueError(f"expected package.module:ClassName, got {value!r}")
        return value


class Spec(_Strict):
    """The static description of a pipeline (Flow's ``Spec``)."""

    pipeline: str = Field(min_length=1)
    partition_count: int = Field(default=1, ge=1, le=4096)
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


def validate_model(model: type[Model], data: Any, *, file: str | None = None, prefix: str = "") -> Model:
    """Validate ``data`` as ``model``; raises :class:`SpecErrors` with one path-named entry per problem."""
    try:
        # Strict: a run must not find out later that ``"4"`` or ``true`` stood where a number belongs.
        return model.model_validate(data, strict=True)
    except ValidationError as error:
        raise SpecErrors([_to_spec_error(e, file, prefix, model) for e in error.errors()]) from None


def _field_names_at(model: type[BaseModel], location: tuple[Any, ...]) -> list[str]:
    """The field names of the model that ``location`` (a pydantic error's ``loc`` without its last
    part) points into, descending through fields, ``Optional``, lists and dict values; ``[]`` when
    it does not lead to a model."""
    current: Any = model
    for part in (*location, None):
        while typing.get_origin(current) in (typing.Union, types.UnionType):
            others = [a for a in typing.get_args(current) if a is not type(None)]
            if len(others) != 1:
                return []
            current = others[0]
        if isinstance(current, type) and issubclass(current, BaseModel):
            fields = {field.alias or name: field for name, field in current.model_fields.items()}
            if part is None:
                return list(fields)  # as the Spec spells them (``schema``, not ``columns``)
            field = fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        elif typing.get_origin(current) in (dict, list) and part is not None:
            current = typing.get_args(current)[-1]  # the part is a key or an index
        else:
            return []
    return []


def _to_spec_error(error: Any, file: str | None, prefix: str, model: type[BaseModel] | None = None) -> SpecError:
    location = "/".join(str(part) for part in (prefix, *error["loc"]) if part != "")
    kind = error["type"]
    if kind == "missing":
        message = "required field is missing"
    elif kind == "extra_forbidden":
        known = _field_names_at(model, tuple(error["loc"][:-1])) if model is not None else []
        close = difflib.get_close_matches(str(error["loc"][-1]), known, n=1, cutoff=0.6)
        message = (f"unknown field; did you mean {close[0]!r}?" if close
                   else "unknown field (check the spelling against the documentation)")
        if "trac" in str(error["loc"][-1]).lower():
            message += f"; {_TRACING_OPTIONS if TRACE_OPTION in known else _TRACING_ELSEWHERE}"
    elif kind in _EXPECTED:
        message = _wrong_type(kind, error["input"])
    else:
        message = str(error["msg"]).removeprefix("Value error, ")
    return SpecError(message, path=location, file=file)


TRACE_OPTION = "propagate_trace_context"
_TRACING_OPTIONS = (f"the one tracing option of a sink is {TRACE_OPTION}: false (no traceparent header on its "
                    "requests); tracing itself is turned on by egress run --otlp-endpoint URL or "
                    "OTEL_EXPORTER_OTLP_ENDPOINT, not in the Spec (docs/observability.md, Tracing)")
_TRACING_ELSEWHERE = ("tracing is turned on by egress run --otlp-endpoint URL or OTEL_EXPORTER_OTLP_ENDPOINT, not "
                      f"in the Spec; an HTTP sink's parameters take {TRACE_OPTION}: false "
                      "(docs/observability.md, Tracing)")


_EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
             "string_type": "a string"}
"""The strict scalar types' pydantic error kinds, and what each expects in the Spec's words."""

_WRITE = {"int_type": "write a whole number", "float_type": "write a number", "bool_type": "write true or false",
          "string_type": "put it in quotes"}


def _wrong_type(kind: str, value: Any) -> str:
    """The message for a value of the wrong scalar type: what was expected, what was given, and the fix."""
    fix = _WRITE[kind]
    if isinstance(value, bool):
        given = f"the boolean {str(value).lower()}"
        if kind == "string_type":
            fix += " (YAML reads yes, no, on, off, true and false unquoted as booleans)"
    elif isinstance(value, str):
        given = f"the string {_shown(value)}"
        if _unquoted_fits(kind, value):
            fix = "write it without quotes"
    elif isinstance(value, (int, float)):
        given = f"the number {value!r}"
    elif value is None:
        given, fix = "null", "write a value or leave the field out"
    else:
        given = "a map" if isinstance(value, dict) else "a list" if isinstance(value, list) else type(value).__name__
        if isinstance(value, (dict, list)):  # quotes would not help: the field takes one value
            fix = f"write one value here, not {given}"
    return f"expected {_EXPECTED[kind]}, got {given}: {fix}"


def _shown(value: str, limit: int = 40) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _unquoted_fits(kind: str, value: str) -> bool:
    """Whether ``value`` written without quotes would be of ``kind`` (``"4"`` for an integer)."""
    text = value.strip()
    if kind == "int_type":
        return text.lstrip("+-").isdigit()
    if kind == "float_type":
        try:
            float(text)
        except ValueError:
            return False
        return True
    return kind == "bool_type" and text.lower() in ("true", "false")


def load_spec(path: str | Path) -> Spec:
    """Load and validate a Spec file (``.yson``, ``.yaml``, ``.json``); raises :class:`SpecError`."""
    return validate_model(Spec, load_document(path), file=str(path))


def load_dynamic_spec(path: str | Path | None) -> DynamicSpec:
    """Load a DynamicSpec file, or return the empty DynamicSpec when ``path`` is ``None``."""
    if path is None:
        return DynamicSpec()
    return validate_model(DynamicSpec, load_document(path), file=str(path))
