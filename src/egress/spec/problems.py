"""Pydantic validation errors in the Spec's words: what is wrong, what was given, and the fix.

Each error of :func:`egress.spec.validate_model` becomes one :class:`SpecError` through
:func:`to_spec_error`; pydantic's own wording ("Input should be a valid list") is kept only for
error kinds not translated here. A field's ``description`` (pydantic ``Field(description=...)``)
is quoted in the message of a bound it breaks, so that the reader learns what the number means.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from egress.errors import SpecError
from egress.spec.durations import format_duration, parse_duration


def model_at(model: type[BaseModel], location: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model that ``location`` (a pydantic error's ``loc``, or a prefix of one) leads to inside
    ``model``, descending through fields, ``Optional``, lists and dict values; ``None`` when it does
    not lead to a model."""
    current: Any = model
    for part in (*location, None):
        while typing.get_origin(current) in (typing.Union, types.UnionType):
            others = [a for a in typing.get_args(current) if a is not type(None)]
            if len(others) != 1:
                return None
            current = others[0]
        if isinstance(current, type) and issubclass(current, BaseModel):
            if part is None:
                return current
            field = fields_of(current).get(str(part))
            if field is None:
                return None
            current = field.annotation
        elif typing.get_origin(current) in (dict, list) and part is not None:
            current = typing.get_args(current)[-1]  # the part is a key or an index
        else:
            return None
    return None


def fields_of(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """``model``'s fields by the name the Spec spells (the alias: ``schema``, not ``columns``)."""
    return {field.alias or name: field for name, field in model.model_fields.items()}


def misplaced_message(name: str, at: str, *, belongs_in_dynamic: bool) -> str:
    """The message for ``name``, a field of the other file: which file it belongs in and under
    which path (``at``, ``""`` for the top level), and why that file."""
    kind = "parameter" if at.endswith("parameters") else "field"
    where = f"under {at}" if at else "at the top level"
    if belongs_in_dynamic:
        return (f"{name} is a DynamicSpec {kind}: put it {where} in the DynamicSpec file (egress run --dynamic-spec "
                "FILE), where it applies without a restart")
    return f"{name} is a Spec {kind}: put it {where} in the Spec file (read once, when egress run starts)"


def to_spec_error(error: Any, file: str | None, prefix: str, model: type[BaseModel] | None = None,
                  misplaced: str | None = None) -> SpecError:
    """One pydantic error (an item of ``ValidationError.errors()``) of ``model``, validated at
    ``prefix`` of ``file``, as a :class:`SpecError`; ``misplaced`` replaces the message of an
    unknown field that belongs elsewhere (see :func:`misplaced_message`)."""
    loc = tuple(error["loc"])
    location = "/".join(str(part) for part in (prefix, *loc) if part != "")
    kind = error["type"]
    owner = model_at(model, loc[:-1]) if model is not None else None
    field = fields_of(owner).get(str(loc[-1])) if owner is not None and loc else None
    if kind == "missing":
        message = "required field is missing"
    elif kind == "extra_forbidden":
        message = misplaced or _unknown_field(str(loc[-1]), list(fields_of(owner)) if owner is not None else [])
    elif kind in _EXPECTED:
        message = _wrong_type(kind, error["input"])
    else:
        subject = str(loc[-1]) if loc and isinstance(loc[-1], str) else "the value"
        message = _broken_rule(kind, error, subject, field) or str(error["msg"]).removeprefix("Value error, ")
    return SpecError(message, path=location, file=file)


def close_match(name: str, known: list[str]) -> str | None:
    """The one of ``known`` that ``name`` is most likely a misspelling of, or ``None``."""
    if not known:  # difflib would still build its matcher for ``name``
        return None
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return close[0] if close else None


def drop_misspelled_missing(errors: list[Any], model: type[BaseModel], examined: int | None = None) -> list[Any]:
    """``errors`` (pydantic's, of ``model``) without each "required field is missing" whose field
    an unknown field beside it misspells: that one's "did you mean" says all, and first. Only the
    unknown fields among the first ``examined`` errors (all when ``None``) are looked at: a later
    one's "did you mean" would not be shown, so its "missing" line stays."""
    misspelled = set()
    for error in errors[:examined]:
        loc = tuple(error["loc"])
        owner = model_at(model, loc[:-1]) if error["type"] == "extra_forbidden" and loc else None
        if owner is not None:
            meant = close_match(str(loc[-1]), list(fields_of(owner)))
            if meant is not None:
                misspelled.add((*loc[:-1], meant))
    return [e for e in errors if not (e["type"] == "missing" and tuple(e["loc"]) in misspelled)]


def _unknown_field(name: str, known: list[str]) -> str:
    close = close_match(name, known)
    message = (f"unknown field; did you mean {close!r}?" if close
               else "unknown field (check the spelling against the documentation)")
    if "trac" in name.lower():
        message += f"; {_TRACING_OPTIONS if TRACE_OPTION in known else _TRACING_ELSEWHERE}"
    return message


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

_BOUNDS = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "more than"),
           "less_than_equal": ("le", "at most"), "less_than": ("lt", "less than")}
"""Pydantic's number bound error kinds: the ``ctx`` key of the bound, and the bound in words."""


def _broken_rule(kind: str, error: Any, subject: str, field: FieldInfo | None) -> str | None:
    """The message for a value of the right type that breaks its field's rule (a bound, a length,
    a choice) or for a map or list of the wrong shape; ``None`` for a kind not translated here."""
    value, ctx = error.get("input"), error.get("ctx") or {}
    meaning = f" ({field.description})" if field is not None and field.description else ""
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        duration = _is_duration(field)
        bound, given = (_number(x) if not duration else format_duration(float(x)) for x in (ctx[key], value))
        return f"{subject} must be {words} {bound}{meaning}, got {given}"
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        return _length(kind, ctx, subject, meaning)
    if kind == "literal_error":
        return f"{subject} must be {ctx['expected']}{meaning}, got {_given(value)}"
    if kind == "finite_number":
        return f"{subject} must be a finite number{meaning}, got {_given(value)}: write a number, not .nan or .inf"
    if kind == "list_type":
        fix = (f"write it as a list: [{value}]" if isinstance(value, str | int | float) and not isinstance(value, bool)
               else "write a list, as [a, b] or one '- item' line per item")
        return f"{subject} must be a list{meaning}, got {_given(value)}: {fix}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"{subject} must be a map of 'name: value' entries{meaning}, got {_given(value)}"
    return None


def _length(kind: str, ctx: dict[str, Any], subject: str, meaning: str) -> str:
    items = "characters" if kind.startswith("string") else "items"
    if kind.endswith("too_short"):
        if ctx.get("min_length") == 1:
            return f"{subject} must not be empty{meaning}"
        return f"{subject} must have at least {ctx.get('min_length')} {items}{meaning}"
    return f"{subject} must have at most {ctx.get('max_length')} {items}{meaning}"


def _number(value: Any) -> str:
    """A bound or a value as written: ``0``, not pydantic's ``0.0`` for a float field's bound."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _is_duration(field: FieldInfo | None) -> bool:
    return field is not None and any(getattr(m, "func", None) is parse_duration for m in field.metadata)


def _given(value: Any) -> str:
    """``value`` as a message names it: ``the string 'x'``, ``the number 4``, ``a map``."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {_shown(value)}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if value is None:
        return "null"
    return "a map" if isinstance(value, dict) else "a list" if isinstance(value, list) else type(value).__name__


def _wrong_type(kind: str, value: Any) -> str:
    """The message for a value of the wrong scalar type: what was expected, what was given, and the fix."""
    fix, given = _WRITE[kind], _given(value)
    if isinstance(value, bool):
        if kind == "string_type":
            fix += " (YAML reads yes, no, on, off, true and false unquoted as booleans)"
    elif isinstance(value, str):
        if _unquoted_fits(kind, value):
            fix = "write it without quotes" + _yaml_number_hint(value)
    elif value is None:
        fix = "write a value or leave the field out"
    elif isinstance(value, dict | list):  # quotes would not help: the field takes one value
        fix = f"write one value here, not {given}"
    return f"expected {_EXPECTED[kind]}, got {given}: {fix}"


def _shown(value: str, limit: int = 40) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _yaml_number_hint(text: str) -> str:
    """How to write ``text`` (a number by Python's reading) so that YAML reads it as a number, when
    YAML 1.1 reads it unquoted as text (``1e3``: an exponent needs a dot and a sign there); else ""."""
    import yaml

    try:
        number = float(text)
        unquoted = yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        return ""
    if (isinstance(unquoted, int | float) and not isinstance(unquoted, bool)) or not math.isfinite(number):
        return ""
    plain = str(int(number)) if number.is_integer() and abs(number) < 1e15 else repr(number)
    return f"; in YAML write {plain} (YAML reads {text.strip()} unquoted as text too)"


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
