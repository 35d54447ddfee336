"""A real ``egress run`` (quiet, embedded, a JSON Spec) loads no module it does not use: what the
start-up work removed stays removed (``tests/unit/cli/test_startup_imports.py`` lists them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.cli.test_startup_imports import NOT_FOR_RUN

pytestmark = pytest.mark.e2e

SPEC = {
    "pipeline": "imports",
    "streams": {"rows": {"schema": [{"name": "id", "type": "int64", "required": True}], "group_by": ["id"]},
                "out": {"schema": [{"name": "id", "type": "int64"}]}},
    "sources": {"in": {"source_class_name": "jsonl", "output_stream_id": "rows", "parameters": {"path": "in.jsonl"}}},
    "computations": {"copy": {"processing_function": "egress:IdentityMap", "input_stream_ids": ["rows"],
                              "output_stream_ids": ["out"]}},
}

# Runs ``egress run`` as ``python -m egress`` does, then prints, at exit, the modules the process loaded.
PROBE = ("import atexit, runpy, sys; "
         "atexit.register(lambda: print(' '.join(sorted(sys.modules)), file=sys.__stdout__)); "
         "sys.argv = ['egress', *sys.argv[1:]]; runpy.run_module('egress', run_name='__main__', alter_sys=True)")


def test_a_quiet_embedded_run_imports_no_other_command_no_rich_no_yaml_and_no_cluster(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"id": 1}\n{"id": 2}\n')
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    done = subprocess.run([sys.executable, "-c", PROBE, "run", "spec.json", "--state-dir", "state", "--until-drained",
                           "--quiet", "--report", "report.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "report.json").read_text())["rows_read"] == 2
    loaded = done.stdout.split()
    assert "egress.runtime.pipeline" in loaded  # the probe saw the run's modules
    heavy = [m for m in loaded if m in NOT_FOR_RUN or m.startswith(tuple(f"{name}." for name in NOT_FOR_RUN))]
    assert heavy == []
