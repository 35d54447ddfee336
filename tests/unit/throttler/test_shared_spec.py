"""DynamicSpec ``throttlers`` spread across cluster workers through the engine's metadata
(``egress.runtime.cluster.throttler_role.SharedThrottlers``), on a real SQLite engine."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from egress.clock import VirtualClock
from egress.engines import SqliteEngine
from egress.runtime.cluster.throttler_role import SPEC_KEY, SharedThrottlers
from egress.spec.models import DynamicSpec
from egress.throttler import Throttling


def dynamic(limit: float, **computations: Any) -> DynamicSpec:
    return DynamicSpec.model_validate({"throttlers": {"endpoint": {"limit": limit}}, "computations": computations})


async def test_a_change_in_one_workers_file_is_published_and_applied_by_the_others(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path, "pipeline")
    await engine.open()
    clock = VirtualClock()
    first, second = Throttling(dynamic(10), clock), Throttling(dynamic(10), clock)
    shared = {"w0": SharedThrottlers(engine, first, "w0"), "w1": SharedThrottlers(engine, second, "w1")}
    await shared["w0"].sync()  # the first worker publishes its throttlers
    await shared["w1"].sync()  # the same in the second's file: nothing new
    assert json.loads(await engine.read_meta(SPEC_KEY) or "")["version"] == 1
    first.reconfigure(dynamic(20))  # w0's file changes
    await shared["w0"].sync()
    await shared["w1"].sync()
    assert second.throttlers["endpoint"].limit == 20.0
    assert shared["w1"].applied == 2
    assert second.file_throttlers == {"endpoint": {"limit": 10}}  # its own file still says 10
    second.reconfigure(dynamic(10, deliver={"sinks": {}}))  # w1 reloads a file whose throttlers did not change
    await shared["w1"].sync()
    assert second.throttlers["endpoint"].limit == 20.0, "a reload of an unchanged section overrides the published"
    await first.aclose()
    await second.aclose()
    await engine.close()


async def test_published_throttlers_invalid_here_are_logged_and_not_applied(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = SqliteEngine(tmp_path, "pipeline")
    await engine.open()
    clock = VirtualClock()
    uses = DynamicSpec.model_validate({"throttlers": {"endpoint": {"limit": 10}},
                                       "computations": {"deliver": {"input_rows_throttler_id": "endpoint"}}})
    throttling = Throttling(uses, clock)
    shared = SharedThrottlers(engine, throttling, "w1")
    await shared.sync()  # publishes version 1
    await engine.write_meta(SPEC_KEY, json.dumps({"version": 2, "worker": "w9", "throttlers": {"other": {}}}))
    with caplog.at_level(logging.WARNING):
        await shared.sync()
    assert "throttlers/" in caplog.text or "input_rows_throttler_id" in caplog.text
    assert "endpoint" in throttling.throttlers
    assert shared.applied == 1
    await throttling.aclose()
    await engine.close()
