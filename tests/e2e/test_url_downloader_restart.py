"""The URL downloader killed mid-way (SIGKILL, real processes) and restarted: the host state and
timers committed before the kill revive the per-host downloads, and every URL ends up emitted
exactly once, still never two requests at a time per host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from egress.cli.state import state_lines
from tests.conftest import REPO
from tests.url_downloader_support import expected_files, free_port, server_log, write_pipeline
from tests.waiting import eventually_sync, exited

KILLS = 3

pytestmark = pytest.mark.e2e


def emitted(state: Path) -> dict[str, dict[str, object]]:
    if not (state / "egress.sqlite3").exists():
        return {}
    return {line["key"][0]: line["row"] for line in state_lines(state, name="processed_urls")}


def run(spec: Path, dynamic: Path, state: Path, log: Path, *, until_drained: bool) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
               "--state-dir", str(state), "--quiet"]
    if until_drained:
        command.append("--until-drained")
    with log.open("wb") as output:
        return subprocess.Popen(command, cwd=REPO, stdout=output, stderr=subprocess.STDOUT)


@pytest.mark.timeout(180)
def test_killed_and_restarted_it_finishes_every_url_exactly_once(tmp_path: Path) -> None:
    port = free_port()
    requests_log = tmp_path / "requests.jsonl"
    sites = subprocess.Popen([sys.executable, "-m", "examples.url_downloader.serve", "--port", str(port),
                              "--log", str(requests_log), "--delay", "0.1"], cwd=REPO, stdout=subprocess.PIPE)
    processes: list[subprocess.Popen[bytes]] = [sites]
    try:
        assert sites.stdout is not None
        assert b"serving" in sites.stdout.readline()
        spec, dynamic = write_pipeline(tmp_path, port, check_host_period="1100ms")
        state = tmp_path / "state"
        expected = expected_files(port)
        midway = 0
        for kill in range(KILLS):
            log = tmp_path / f"run{kill}.log"
            process = run(spec, dynamic, state, log, until_drained=False)
            processes.append(process)
            before = len(emitted(state))
            eventually_sync(lambda seen=before: len(emitted(state)) != seen, what="a URL emitted", timeout=60,
                            interval=0.05, unless=exited(process, log), details=log.read_text)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            done = emitted(state)
            pending = list(state_lines(state, name="host_state"))
            print(f"kill {kill}: {len(done)} of {len(expected)} URLs emitted, "
                  f"{sum(len(p['value']['urls']) for p in pending)} waiting in host state")
            # A restart fires every due host timer in one epoch, which may commit all that is left:
            # the last kill may come after everything, the others must land mid-way.
            midway += len(done) < len(expected)
        assert midway >= KILLS - 1, f"only {midway} of {KILLS} kills came before everything was done"
        log = tmp_path / "final.log"
        final = run(spec, dynamic, state, log, until_drained=True)
        processes.append(final)
        assert final.wait(timeout=90) == 0, log.read_text()
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    rows = emitted(state)
    assert set(rows) == set(expected)
    for url, row in rows.items():
        assert (row["status"], row["bytes"], row["sha256"], row["emitted"]) == (200, *expected[url], 1), url
    assert {r["in_flight"] for r in server_log(requests_log)} == {1}
    assert list(state_lines(state, name="host_state")) == []
