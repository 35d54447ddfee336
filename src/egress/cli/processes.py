"""``egress run --processes N``: N worker processes on one machine share one pipeline.

The parent holds the state directory (it opens the SQLite engine, which takes the directory's
lock and checks the Spec's layout, and keeps it open) and starts N children, each ``egress run``
with the same arguments as a cluster worker (``--worker-id <base>-<i>``; with SQLite
``--shared-state``: ``SqliteEngine(shared=True)``, no lock of its own). It restarts a child that
dies unexpectedly (a signal, or an exit code egress does not use) under the same worker id, so it
takes its own leases back at once; forwards Ctrl-C and SIGTERM to every child; ends when all have
ended, and prints one summary of their reports. Each child is given ``--supervisor PID`` and ends
with the parent (``egress.cli.supervision``): a parent killed outright leaves none running.
Children run in their own session, so a Ctrl-C at the terminal reaches them only through the
parent (once, not twice).

Throttlers are global to the pipeline: on SQLite, when the DynamicSpec declares throttlers and no
``--throttler-url`` is given, the parent starts ``egress throttler serve`` on a free loopback port
(its restart horizon in the state directory) and gives every child ``--throttler-url``, so the N
processes share one controller instead of each running its own (which would multiply every limit
by N). On NATS the workers elect a controller themselves.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from egress.cli.exit_codes import EXIT_CODES
from egress.cli.interrupts import again
from egress.engines import Engine
from egress.runtime import Plan
from egress.runtime.cluster.worker import default_worker_id
from egress.runtime.options import EngineChoice, RunOptions
from egress.runtime.pipeline import check_state_directory, sqlite_engine

console = Console(stderr=True, soft_wrap=True)
# A child that ends with one of EXIT_CODES (egress run's) ended as meant; any other end is unexpected:
# it is started again.
MAX_RESTARTS = 10
"""Restarts of one child before the run gives up on it (a child that cannot live is not a crash loop)."""
THROTTLER_START_TIMEOUT = 30.0
"""Seconds the parent waits for the throttler service it starts to say where it listens."""


class ProcessesRun:
    """One ``egress run --processes N``: ``arguments`` are what every child's ``egress run`` gets
    (the Spec and the options they share); child ``i`` serves ``/status`` on ``http_port + i`` (0:
    each picks a port; ``None``: none)."""

    def __init__(self, plan: Plan, state_dir: Path, engine: EngineChoice, count: int, arguments: list[str], *,
                 quiet: bool, report: Path | None, base_id: str | None, http_port: int | None = None) -> None:
        self.plan = plan
        self.state_dir = state_dir.absolute()
        self.engine = engine
        self.count = count
        self.base_id = base_id or default_worker_id()
        self.quiet = quiet
        self.report = report
        self._arguments = arguments
        self._http_port = http_port
        self._reports = Path(tempfile.mkdtemp(prefix="egress-processes-"))
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._restarts: dict[int, int] = {}
        self._stopping = False
        self._interrupts = 0  # Ctrl-Cs and SIGTERMs forwarded to running children

    def run(self) -> int:
        """Run the children to their end; the exit code of the whole run."""
        holder = None if self.engine.is_nats else sqlite_engine(self.state_dir, self.plan.spec.pipeline, RunOptions())
        service: subprocess.Popen[str] | None = None
        try:
            if holder is not None:
                asyncio.run(self._hold(holder))
                service = self._serve_throttlers()
            started = time.monotonic()
            codes = self._supervise()
            return self._finish(codes, time.monotonic() - started)
        finally:
            if service is not None:
                _stop(service)
            if holder is not None:
                asyncio.run(holder.close())

    def _serve_throttlers(self) -> subprocess.Popen[str] | None:
        """Start one ``egress throttler serve`` for every child (see the module docstring) and add its
        URL to the children's arguments; ``None`` when the run needs none. Raises
        :class:`~egress.errors.EgressError` when the service does not start."""
        from egress.errors import EgressError
        from egress.throttler import THROTTLER_STATE_NAME

        file = self.plan.dynamic_spec_file
        if not self.plan.dynamic_spec.throttlers or file is None or "--throttler-url" in self._arguments:
            return None
        command = [sys.executable, "-m", "egress", "throttler", "serve", "--dynamic-spec", str(Path(file).absolute()),
                   "--port", "0", "--host", "127.0.0.1", "--state-file", str(self.state_dir / THROTTLER_STATE_NAME),
                   "--supervisor", str(os.getpid())]
        service = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        url, seen = _listening_url(service)
        if url is None:
            _stop(service)
            raise EgressError(f"the throttler service for the {self.count} processes did not start: "
                              f"{' '.join(seen).strip() or 'no output'}")
        self._arguments = [*self._arguments, "--throttler-url", url]
        # Keep reading its output, so that a full pipe never blocks it.
        threading.Thread(target=_drain, args=(service,), daemon=True).start()
        return service

    async def _hold(self, holder: Engine) -> None:
        """Open the state directory (its lock, for the whole run) and check the Spec's layout there."""
        from egress.errors import SpecMismatchError

        try:
            await holder.open()
        except SpecMismatchError as mismatch:  # another pipeline's directory: name the Spec, as layouts do
            raise mismatch.in_file(self.plan.spec_file) from None
        await check_state_directory(holder, self.plan)

    def child_command(self, index: int) -> list[str]:
        command = [sys.executable, "-m", "egress", "run", *self._arguments, "--state-dir", str(self.state_dir),
                   "--worker-id", f"{self.base_id}-{index}", "--quiet", "--supervisor", str(os.getpid()),
                   "--report", str(self._reports / f"worker-{index}.json")]
        if self._http_port is not None:
            command += ["--http-port", str(self._http_port + index if self._http_port else 0)]
        return [*command, "--shared-state"] if not self.engine.is_nats else command

    def _start(self, index: int) -> None:
        self._children[index] = subprocess.Popen(self.child_command(index), start_new_session=True)

    def _forward(self, signum: int, frame: object) -> None:
        """Ctrl-C or SIGTERM of the run: said once here for every child (each is ``--supervisor``'d:
        silent), then sent to each."""
        if any(child.poll() is None for child in self._children.values()):
            self._interrupts += 1
            if self._interrupts == 1:
                console.print(f"stopping the {self.count} processes after the message each has in hand; what was "
                              f"processed is committed ({again(signum)} to exit at once)", highlight=False)
            else:
                console.print(f"second interrupt: the {self.count} processes exit at once", highlight=False)
        self._signal_children(signum)

    def _signal_children(self, signum: int) -> None:
        self._stopping = True
        for child in self._children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    def _supervise(self) -> dict[int, int]:
        """Start every child, restart the ones that die unexpectedly; their exit codes once all ended."""
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for index in range(self.count):
                self._start(index)
            codes: dict[int, int] = {}
            while len(codes) < self.count:
                time.sleep(0.1)
                for index, child in self._children.items():
                    code = child.poll()
                    if index in codes or code is None:
                        continue
                    if self._should_restart(index, code):
                        console.print(f"worker {self.base_id}-{index} ended unexpectedly ({_describe(code)}): "
                                      "starting it again", highlight=False)
                        self._start(index)
                    else:
                        codes[index] = code
                        if code == 2:  # a Spec the others cannot run either: stop them
                            self._signal_children(signal.SIGTERM)
            return codes
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _should_restart(self, index: int, code: int) -> bool:
        if self._stopping or code in EXIT_CODES or self._restarts.get(index, 0) >= MAX_RESTARTS:
            return False
        self._restarts[index] = self._restarts.get(index, 0) + 1
        return True

    def _finish(self, codes: dict[int, int], elapsed: float) -> int:
        from egress.cli.report import summary_table

        values = merge_reports([self._reports / f"worker-{i}.json" for i in range(self.count)], elapsed)
        values["workers"] = self.count
        values["restarts"] = sum(self._restarts.values())
        if self.report is not None:
            self.report.write_text(json.dumps(values, indent=2) + "\n")
        if not self.quiet:
            console.print(summary_table(values, title=f"egress run --processes {self.count}"))
        return exit_code(list(codes.values()))


def _listening_url(service: subprocess.Popen[str]) -> tuple[str | None, list[str]]:
    """The URL in ``egress throttler serve``'s first line (``None`` if it ends or stays silent for
    :data:`THROTTLER_START_TIMEOUT`), and the lines it printed."""
    assert service.stdout is not None
    deadline = time.monotonic() + THROTTLER_START_TIMEOUT
    seen: list[str] = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([service.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = service.stdout.readline()
        if not line:
            break
        seen.append(line)
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return match.group(1), seen
    return None, seen


def _drain(service: subprocess.Popen[str]) -> None:
    assert service.stdout is not None
    for _ in service.stdout:
        pass


def _stop(service: subprocess.Popen[str]) -> None:
    """SIGTERM the throttler service and wait for it (SIGKILL after 10 s)."""
    service.terminate()
    try:
        service.wait(timeout=10)
    except subprocess.TimeoutExpired:
        service.kill()
        service.wait()


def merge_reports(paths: list[Path], elapsed: float) -> dict[str, Any]:
    """One report from the children's ``--report`` files (those that exist): counters added up."""
    merged: dict[str, Any] = {"responses": {}, "blocked": [], "status": {}, "drained": True, "errors": [],
                              "error_outputs": {}}
    counters = ("rows_read", "bad_records_skipped", "bad_records_dead_lettered", "messages_processed", "posts",
                "retries", "attempt_failures", "delivered", "dead_letters", "error_output_records", "responses_2xx",
                "unacknowledged", "epochs")
    for name in counters:
        merged[name] = 0
    for path in paths:
        if not path.exists():
            merged["drained"] = False
            continue
        values = json.loads(path.read_text())
        for name in counters:
            merged[name] += values.get(name, 0)
        for code, count in values.get("responses", {}).items():
            merged["responses"][code] = merged["responses"].get(code, 0) + count
        for sink, output in values.get("error_outputs", {}).items():  # each sink's file, its records added up
            known = merged["error_outputs"].setdefault(sink, {"path": output.get("path"), "records": 0})
            known["records"] += output.get("records", 0)
        merged["blocked"] += values.get("blocked", [])
        merged["status"].update(values.get("status", {}))
        merged["drained"] = merged["drained"] and bool(values.get("drained"))
        if values.get("error"):
            merged["errors"].append(values["error"])
    merged["responses"] = dict(sorted(merged["responses"].items()))
    merged["elapsed_seconds"] = round(elapsed, 3)
    merged["messages_per_second"] = round(merged["delivered"] / elapsed, 1) if elapsed > 0 else 0.0
    return merged


def exit_code(codes: list[int]) -> int:
    """The run's exit code from its children's: a Spec problem (2) first, then a failure (1), then
    an interruption (130), else 0."""
    for code in (2, 1, 130):
        if code in codes:
            return code
    return 0 if all(code == 0 for code in codes) else 1


def _describe(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"

