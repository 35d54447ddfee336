"""``egress run``'s garbage-collector settings (``egress.runtime.garbage_collection``)."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from egress.cli.main import app
from egress.runtime.garbage_collection import OLDER_THRESHOLDS, YOUNG_THRESHOLD, tune_for_run
from tests.conftest import payload_spec


@pytest.fixture
def restored_thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*before)


def test_tune_for_run_raises_the_thresholds(restored_thresholds: None) -> None:
    gc.set_threshold(700, 10, 10)
    tune_for_run()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)


def test_egress_run_runs_with_the_tuned_collector(tmp_path: Path, restored_thresholds: None) -> None:
    gc.set_threshold(700, 10, 10)
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a", "b"])
    document: dict[str, Any] = yaml.safe_load(spec.read_text())
    document["computations"]["deliver"]["sinks"] = {}  # nothing to serve
    spec.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(app, ["run", str(spec), "--state-dir", str(tmp_path / "state"), "--until-drained",
                                      "--quiet"])
    assert result.exit_code == 0, result.output
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)


def test_the_command_line_raises_the_thresholds_before_its_imports() -> None:
    probe = "import gc, sys; import egress.cli; print(*gc.get_threshold(), 'typer' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert shown == [str(YOUNG_THRESHOLD), *map(str, OLDER_THRESHOLDS), "False"]  # set before typer and the rest
