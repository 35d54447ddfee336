"""The status tree: path → current error, as Flow's pipeline status shows it.

A path (``/sinks/<sink>/async_http_sink``) is in error while at least one reporter keeps an error
there; the shown error is the one with the smallest order key (the oldest failing delivery).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from egress.version import __version__


@dataclass(frozen=True)
class StatusEntry:
    path: str
    error: str


class StatusTree:
    """Errors by path and by order key within a path. ``on_change(path, broken)`` is called when a
    path goes into or out of error (the metrics layer sets the ``broken`` gauge from it)."""

    def __init__(self, on_change: Callable[[str, bool], None] | None = None) -> None:
        self._errors: dict[str, dict[int, str]] = {}
        self._on_change = on_change

    def set_error(self, path: str, order: int, error: str) -> None:
        """Record ``error`` for the item ``order`` (e.g. a sequence number) under ``path``."""
        errors = self._errors.setdefault(path, {})
        was_broken = bool(errors)
        errors[order] = error
        if not was_broken and self._on_change:
            self._on_change(path, True)

    def clear_error(self, path: str, order: int) -> None:
        """Forget the error of item ``order``; the path clears when no item remains in error."""
        errors = self._errors.get(path)
        if not errors or errors.pop(order, None) is None:
            return
        if not errors:
            del self._errors[path]
            if self._on_change:
                self._on_change(path, False)

    def error(self, path: str) -> str | None:
        """The error of the oldest failing item under ``path``, or ``None``."""
        errors = self._errors.get(path)
        return errors[min(errors)] if errors else None

    def entries(self) -> list[StatusEntry]:
        """Every path in error with its shown error, sorted by path."""
        return [StatusEntry(path, self.error(path) or "") for path in sorted(self._errors)]


def egress_version() -> str:
    """The version of egress (``egress --version``, ``/status``)."""
    return __version__


def readiness(document: dict[str, Any]) -> dict[str, Any]:
    """Whether the instance whose ``/status`` JSON is ``document`` is ready (``/readyz``):
    ``{"ready": bool, "reasons": [str, ...]}``, one reason per problem: the engine is not open
    (``running`` false: starting or stopped), a sink of a partition running here is blocked by a
    terminal failure (``partitions[*].blocked``), or the DynamicSpec file in force failed to load
    (``dynamic_spec.error``; the previous one stays in force, but the file on disk is not it)."""
    reasons: list[str] = []
    if not document.get("running"):
        reasons.append("the engine is not open (the run is starting or has stopped)")
    for partition in document.get("partitions", []):
        if partition.get("blocked"):
            reasons.append(f"blocked: {partition['blocked']}")
    error = (document.get("dynamic_spec") or {}).get("error")
    if error:
        reasons.append(f"DynamicSpec {error}")
    return {"ready": not reasons, "reasons": reasons}
