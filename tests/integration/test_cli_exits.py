"""The ``egress`` commands' exit codes and error lines as a user's shell sees them: each command is a
real subprocess, its stdout and stderr pipes (not a terminal)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def egress(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m egress ARGUMENTS`` in ``cwd``, to its end (a generous deadline guards a hang)."""
    return subprocess.run([sys.executable, "-m", "egress", *arguments], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_throttler_serve_names_a_missing_dynamic_spec_and_exits_2(tmp_path: Path) -> None:
    """As ``egress run missing.yaml`` does: one line naming the file, no traceback, exit 2."""
    served = egress("throttler", "serve", "--dynamic-spec", "missing.yaml", "--port", "0", cwd=tmp_path)
    assert served.returncode == 2
    assert served.stderr == "missing.yaml: file not found\n"
    run = egress("run", "missing.yaml", cwd=tmp_path)
    assert (run.returncode, run.stderr) == (served.returncode, served.stderr)
