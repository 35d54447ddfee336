"""An interrupt that lands in ``egress run``'s exit, after its loop closed (here inside
``settle_for_exit``'s garbage collection): exit 130 at once with one line, no traceback."""

from __future__ import annotations

import importlib.abc
import subprocess
import sys
from pathlib import Path

import pytest

from egress.cli import entry
from egress.cli import main as cli
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


def test_a_ctrl_c_before_the_command_handles_its_own_exits_130_with_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C while a command still imports or loads its Spec: ``interrupted``, 130, no traceback."""
    def interrupted_command() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "command_line", lambda named: interrupted_command)
    monkeypatch.setattr(cli, "settle_for_exit", lambda: None)
    monkeypatch.setattr(sys, "argv", ["egress", "validate", "spec.yaml"])
    with pytest.raises(SystemExit) as exited:
        entry.main()
    assert exited.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"


class _InterruptedImport(importlib.abc.MetaPathFinder):
    """A Ctrl-C that lands while ``egress.cli.main`` is being imported."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "egress.cli.main":
            raise KeyboardInterrupt


def test_a_ctrl_c_during_the_command_lines_imports_exits_130_with_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delitem(sys.modules, "egress.cli.main")
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport(), *sys.meta_path])
    with pytest.raises(SystemExit) as exited:
        entry.main()
    assert exited.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"
