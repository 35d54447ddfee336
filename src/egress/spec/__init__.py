"""Spec and DynamicSpec: models, loaders (YSON, YAML, JSON) and durations."""

from egress.spec.durations import Duration, format_duration, parse_duration
from egress.spec.loader import load_document
from egress.spec.models import (
    PROCESS_FUNCTION_COMPUTATION,
    Column,
    ComputationSpec,
    DynamicSpec,
    SinkSpec,
    SourceSpec,
    Spec,
    StreamSpec,
    load_dynamic_spec,
    load_spec,
    misplaced_fields,
    validate_model,
)

__all__ = [
    "PROCESS_FUNCTION_COMPUTATION",
    "Column",
    "ComputationSpec",
    "Duration",
    "DynamicSpec",
    "SinkSpec",
    "SourceSpec",
    "Spec",
    "StreamSpec",
    "format_duration",
    "load_document",
    "load_dynamic_spec",
    "load_spec",
    "misplaced_fields",
    "parse_duration",
    "validate_model",
]
