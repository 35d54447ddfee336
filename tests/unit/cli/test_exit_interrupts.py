"""An interrupt that lands in ``egress run``'s exit, after its loop closed (here inside
``settle_for_exit``'s garbage collection): exit 130 at once with one line, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.interrupted_exit import write_spec


def test_an_interrupt_in_settle_for_exit_exits_130_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    done = subprocess.run([sys.executable, "-m", "tests.interrupted_exit", "run", str(spec), "--until-drained",
                           "--quiet", "--state-dir", str(tmp_path / "state")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == ["interrupt: exiting at once; the final commit is made"]
