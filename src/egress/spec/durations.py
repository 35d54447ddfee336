"""Durations as Flow writes them: ``100ms``, ``10s``, ``1m``, ``1h``, ``1d``, ``1m30s``, or an integer
number of milliseconds (the YSON ``TDuration`` convention). Parsed values are ``float`` seconds."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_UNIT_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:us|ms|s|m|h|d))+")

DURATION_HINT = "write a duration like 100ms, 10s, 1m, 1h or an integer number of milliseconds"


def parse_duration(value: Any) -> float:
    """Return ``value`` as seconds.

    Accepts a string of one or more ``<number><unit>`` parts (units us, ms, s, m, h, d) or an
    integer (milliseconds). Raises ``ValueError`` naming the value for anything else, including
    booleans, floats without a unit and negative numbers.
    """
    if isinstance(value, bool):
        raise ValueError(f"cannot parse duration {value!r}: {DURATION_HINT}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value} ms")
        return value / 1000.0
    if isinstance(value, str):
        text = value.strip()
        if _WHOLE.fullmatch(text):
            return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(text))
        if text.isdigit():
            return int(text) / 1000.0
    raise ValueError(f"cannot parse duration {value!r}: {DURATION_HINT}")


def format_duration(seconds: float) -> str:
    """The shortest exact ``ms``/``s`` spelling of ``seconds`` (``0.1`` → ``100ms``, ``60`` → ``60s``)."""
    milliseconds = round(seconds * 1000)
    if milliseconds % 1000 == 0:
        return f"{milliseconds // 1000}s"
    return f"{milliseconds}ms"


Duration = Annotated[float, BeforeValidator(parse_duration), PlainSerializer(format_duration)]
"""A pydantic field type: a duration in seconds, parsed by :func:`parse_duration`."""
