"""Sizes as a Spec writes them: an integer number of bytes, or digits with a unit, ``B``; ``KB``,
``MB``, ``GB`` (powers of 1000); ``KiB``, ``MiB``, ``GiB`` (powers of 1024). Parsed values are
``int`` bytes. ``Annotated[int, size_within(least, most)]`` is a pydantic field of bounded size
whose messages give the bound in the unit the value was written in."""

from __future__ import annotations

import functools
import re
from typing import Any

from pydantic import BeforeValidator

UNITS = {"B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_SIZE = re.compile(r"(\d+)\s*(" + "|".join(UNITS) + ")?")
SIZE_HINT = ("write a number of bytes, like 1048576, or digits with a unit: B; KB, MB, GB (1000s); KiB, MiB, GiB "
             "(1024s), like 512KiB or 10MB")


def parse_size(value: Any) -> tuple[int, str | None]:
    """``value`` as ``(bytes, unit)``: an integer (bytes, unit ``None``) or a string of digits with an
    optional unit of :data:`UNITS`. Raises ``ValueError`` naming the value and the accepted units."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, None
    if isinstance(value, str):
        found = _SIZE.fullmatch(value.strip())
        if found is not None:
            unit = found.group(2)
            return int(found.group(1)) * UNITS[unit or "B"], unit
    raise ValueError(f"cannot read {value!r} as a size: {SIZE_HINT}")


def format_size(size: int, unit: str | None = None) -> str:
    """``size`` bytes in ``unit`` (``64MiB``; ``0.0625GiB (64MiB)`` with the largest binary unit that
    divides it exactly when ``unit`` does not), or, without one or under 1 KiB, as bytes
    (``67,108,864 bytes (64MiB)``, ``1 byte``)."""
    binary = next((name for name in ("GiB", "MiB", "KiB") if size >= UNITS[name] and size % UNITS[name] == 0), None)
    exact = None if binary is None else f"{size // UNITS[binary]}{binary}"
    if unit is not None and unit != "B" and size >= UNITS["KiB"]:
        written = f"{size / UNITS[unit]:.12g}{unit}"
        return written if size % UNITS[unit] == 0 or exact is None else f"{written} ({exact})"
    plain = f"{size:,} byte{'s' if size != 1 else ''}"
    return plain if exact is None else f"{plain} ({exact})"


def _bounded(minimum: int, maximum: int, value: Any) -> int:
    """:func:`parse_size` of ``value`` within ``minimum``..``maximum`` bytes, or ``ValueError``
    giving the bound in the value's own unit."""
    size, unit = parse_size(value)
    written = value.strip() if isinstance(value, str) else format_size(size)
    if size > maximum:
        raise ValueError(f"{written} is more than the limit, {format_size(maximum, unit)}")
    if size < minimum:
        raise ValueError(f"{written} is less than the least, {format_size(minimum, unit)}")
    return size


def size_within(minimum: int, maximum: int) -> BeforeValidator:
    """The validator of a pydantic ``Annotated[int, ...]`` field: a size in bytes (:func:`parse_size`)
    from ``minimum`` to ``maximum``."""
    return BeforeValidator(functools.partial(_bounded, minimum, maximum))
