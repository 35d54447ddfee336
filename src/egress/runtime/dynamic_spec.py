"""A run's DynamicSpec file, applied live: reloaded when it changes, checked, applied or reported.

Every ``dynamic_spec_period`` seconds the file's modification time and size are compared with
what was read last (first: what the plan read, about when the run was made, so a change while the
run starts is still a change). A changed file is loaded, validated and built into a plan with the
Spec in force; a file that does not load or validate, or whose throttlers the run's throttling
refuses, is reported (status path :data:`DYNAMIC_SPEC_STATUS` and :attr:`DynamicSpecFile.error`)
and ignored: the parameters in force stay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from egress.clock import Clock
from egress.errors import SpecError
from egress.observe import StatusTree
from egress.runtime.plan import Plan, build_plan, validate_dynamic_spec
from egress.spec import DynamicSpec, load_document

DYNAMIC_SPEC_STATUS = "/dynamic_spec"
"""The status path of a DynamicSpec file that was not applied."""

Apply = Callable[[Plan, DynamicSpec], None]
"""Puts a reloaded plan and its DynamicSpec in force; raises :class:`SpecError` to refuse them
(then nothing of them is in force)."""


class DynamicSpecFile:
    """The DynamicSpec file of the plan ``current()`` returns (``None``: the run has none), checked
    every ``period`` seconds on ``clock`` until ``stop`` is set; ``apply`` puts a reloaded one in
    force. ``version`` counts the reloads applied; ``error`` is the last reload's (``None`` once one
    applied); ``status`` shows it."""

    def __init__(self, current: Callable[[], Plan], apply: Apply, status: StatusTree, *, clock: Clock,
                 period: float, stop: asyncio.Event) -> None:
        self._current = current
        self._apply = apply
        self._status = status
        self._clock = clock
        self._period = period
        self._stop = stop
        self.file = current().dynamic_spec_file
        self.version = 0
        self.error: str | None = None
        self._read = _modified(self.file) if self.file else None

    async def watch(self) -> None:
        """Reload the file whenever it changed, until ``stop`` is set."""
        if self.file is None:
            return
        while not self._stop.is_set():
            await self._clock.sleep(self._period)
            modified = _modified(self.file)
            if modified != self._read:
                self._read = modified
                self.reload()

    def reload(self) -> bool:
        """Read, check and apply the file; returns whether it was applied."""
        file, plan = self.file, self._current()
        assert file is not None
        try:
            dynamic = validate_dynamic_spec(load_document(file), plan.spec.model_dump(by_alias=True), file=file)
            self._apply(build_plan(plan.spec, dynamic, base_dir=plan.base_dir, spec_file=plan.spec_file,
                                   dynamic_spec_file=file), dynamic)
        except SpecError as error:
            self.error = f"ignored, the previous DynamicSpec stays in force: {error}"
            self._status.set_error(DYNAMIC_SPEC_STATUS, 0, self.error)
            return False
        self.error = None
        self._status.clear_error(DYNAMIC_SPEC_STATUS, 0)
        self.version += 1
        return True


def _modified(path: str) -> tuple[float, int] | None:
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return (stat.st_mtime, stat.st_size)
