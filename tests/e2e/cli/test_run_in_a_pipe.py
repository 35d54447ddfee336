"""``egress run`` and ``egress status --watch`` with their output in pipes (a log collector, ``| tee``),
not a terminal: the dashboard's address, a DynamicSpec that fails to load, and one status line per
refresh, each read as it is written. Real processes; every wait is for a line, with a deadline
only as a failure guard."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, payload_spec
from tests.e2e.conftest import terminate

pytestmark = pytest.mark.e2e
DEADLINE = 60.0  # seconds: a failure guard, never a pace


class Lines:
    """The lines a process writes to one pipe, read by a thread as they come."""

    def __init__(self, pipe: object) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: object) -> None:
        for line in pipe:  # type: ignore[attr-defined]
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def until(self, pattern: str) -> re.Match[str]:
        """The first line from now on that matches ``pattern``; fails at the end of the output."""
        while True:
            line = self._queue.get(timeout=DEADLINE)
            if line is None:
                pytest.fail(f"no line matching {pattern!r}; the output was:\n" + "\n".join(self.seen))
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found


def live_spec(tmp_path: Path) -> tuple[Path, Path]:
    """The payload pipeline reading a followed, empty file (a run that goes on until stopped)."""
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", [])
    document = yaml.safe_load(spec.read_text())
    document["sources"]["events_jsonl"]["parameters"]["follow"] = True
    spec.write_text(yaml.safe_dump(document))
    return spec, dynamic


def test_run_and_status_watch_write_their_lines_into_a_pipe_as_they_happen(tmp_path: Path) -> None:
    spec, dynamic = live_spec(tmp_path)
    run = subprocess.Popen([sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
                            "--state-dir", str(tmp_path / "state"), "--http-port", "0"], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch: subprocess.Popen[str] | None = None
    try:
        said = Lines(run.stderr)
        url = said.until(r"^dashboard, metrics and status at (http://127\.0\.0\.1:\d+)/ ").group(1)
        dynamic.write_text("computations: {deliver: {sinks: {http: {parameters: {retry_initial_delay: soon}}}}}\n")
        said.until(rf"^DynamicSpec ignored, the previous DynamicSpec stays in force: {re.escape(str(dynamic))}: "
                   r"computations/deliver/sinks/http/parameters/retry_initial_delay: cannot parse duration 'soon'")
        watch = subprocess.Popen([sys.executable, "-m", "egress", "status", url, "--watch", "--interval", "0.2"],
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        shown = Lines(watch.stdout)
        line = r"^\d\d:\d\d:\d\d pipeline test_pipeline at .*: running, NOT READY; 1 partitions, input lag 0, " \
               r"unacknowledged 0, blocked 0, errors 1$"
        shown.until(line)
        shown.until(line)  # a line per refresh, not one at the end
    finally:
        if watch is not None:
            terminate(watch)  # type: ignore[arg-type]
        terminate(run)  # type: ignore[arg-type]
