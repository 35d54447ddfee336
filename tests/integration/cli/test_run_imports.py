"""What ``egress run`` imports: a Spec that uses no server, throttler or NATS engine does not pay
their libraries' start-up (aiohttp alone is ~0.4 s of CPU per process), nor the other commands',
rich's or (for a JSON Spec) PyYAML's; the status server loads aiohttp only with ``--http-port``."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import yaml

from egress.receiver import Receiver
from tests.conftest import ServerFactory, payload_spec
from tests.unit.cli.test_startup_imports import NOT_FOR_RUN

pytestmark = pytest.mark.integration

UNUSED = ("aiohttp", "nats", "egress.receiver", "egress.firehose.receiver", "egress.observe.server",
          "egress.observe.dashboard", "egress.throttler.http_transport", "egress.throttler.service",
          *NOT_FOR_RUN)  # and the other commands, rich (a --quiet run prints nothing), yaml (a JSON Spec)

# Runs the CLI as `python -m egress` does and writes, at exit, which of the modules were imported.
PROBE = """
import atexit, sys
modules, out = sys.argv[1].split(","), sys.argv[2]
atexit.register(lambda: open(out, "w").write(",".join(m for m in modules if m in sys.modules)))
sys.argv = ["egress", *sys.argv[3:]]
from egress.cli.main import main
main()
"""


async def _run_probe(tmp_path: Path, url: str, *options: str) -> list[str]:
    written, _ = payload_spec(tmp_path, url, ["a", "b", "c"])
    spec = written.with_suffix(".json")  # the same Spec as JSON: a run of it does not import PyYAML
    spec.write_text(json.dumps(yaml.safe_load(written.read_text())))
    loaded = tmp_path / "loaded.txt"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROBE, ",".join(UNUSED), str(loaded), "run", str(spec), "--state-dir",
        str(tmp_path / "state"), "--until-drained", "--quiet", *options)
    assert await asyncio.wait_for(process.wait(), 120) == 0
    return [name for name in loaded.read_text().split(",") if name]


async def test_a_file_to_http_run_does_not_import_aiohttp_nats_or_the_servers(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    base = await serve_app(receiver.app)
    assert await _run_probe(tmp_path, f"{base}/events") == []
    assert receiver.stats.requests == 3  # the run delivered: the HTTP sink ran without them


async def test_the_status_server_imports_aiohttp_when_a_run_serves_http(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    base = await serve_app(receiver.app)
    loaded = await _run_probe(tmp_path, f"{base}/events", "--http-port", "0")
    assert {"aiohttp", "egress.observe.server", "egress.observe.dashboard"} <= set(loaded)
    assert receiver.stats.requests == 3
