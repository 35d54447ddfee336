"""The runtime on each engine: a whole pipeline runs on the engine its ``engine_factory`` makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from egress.engines import Engine
from egress.receiver import Receiver
from egress.runtime import Pipeline, RunOptions, load_plan
from tests.conftest import ServerFactory, payload_spec
from tests.engines.engines import ENGINES

pytestmark = pytest.mark.integration


async def test_a_pipeline_runs_and_resumes_on_the_engine_its_factory_makes(
        engine_name: str, tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    base = await serve_app(receiver.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [f"p{i}" for i in range(200)], partition_count=2)
    options = RunOptions(until_drained=True)
    made: list[tuple[Path, str, RunOptions]] = []

    def factory(state_dir: Path, pipeline: str, run_options: RunOptions) -> Engine:
        made.append((state_dir, pipeline, run_options))
        return ENGINES[engine_name](state_dir, pipeline)

    for _ in range(2):  # the second run resumes from what the first committed: nothing is posted again
        result = await Pipeline(load_plan(spec, dynamic), tmp_path / "state", options=options,
                                engine_factory=factory).run()
        assert result.ok
        assert result.drained
        assert receiver.stats.requests == 200
    assert made == [(tmp_path / "state", "test_pipeline", options)] * 2
