"""``egress endpoint resume`` in a cluster: every live member with a status endpoint is asked, not
only the worker named on the command line.

The workers here are aiohttp servers speaking the two routes the command uses (``/status`` with
``worker`` and ``members``, ``POST /endpoints/NAME/resume``) as `egress run --http-port` serves them;
the resume against a real run is `tests/e2e/connectors/sinks/test_webhook_http.py`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from tests.ports import free_port

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]


@asynccontextmanager
async def workers(knows: dict[str, bool],
                  silent: frozenset[str] = frozenset()) -> AsyncIterator[tuple[dict[str, int], dict[str, list[str]]]]:
    """One server per worker in ``knows`` (whether its sink knows the endpoint); a worker in
    ``silent`` is listed as a member but does not listen. Yields each worker's port and the endpoints
    each worker resumed."""
    ports = {worker: free_port() for worker in knows}
    resumed: dict[str, list[str]] = {worker: [] for worker in knows}
    members = [{"worker_id": w, "status_url": f"http://127.0.0.1:{p}"} for w, p in ports.items()]
    runners = []
    for worker, port in ports.items():
        if worker in silent:
            continue

        async def status(request: web.Request, worker: str = worker) -> web.Response:
            return web.json_response({"worker": worker, "members": members, "partitions": []})

        async def resume(request: web.Request, worker: str = worker) -> web.Response:
            if not knows[worker]:
                raise web.HTTPNotFound()
            resumed[worker].append(request.match_info["name"])
            return web.json_response({"resumed": 2})

        app = web.Application()
        app.add_routes([web.get("/status", status), web.post("/endpoints/{name}/resume", resume)])
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    try:
        yield ports, resumed
    finally:
        for runner in runners:
            await runner.cleanup()


async def resume(name: str, port: int) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "egress", "endpoint", "resume", name,
                                                    f"127.0.0.1:{port}"], cwd=REPO, capture_output=True, text=True,
                                   timeout=60)


async def test_resume_asked_of_one_worker_reaches_every_member_that_runs_the_endpoint() -> None:
    async with workers({"w1": True, "w2": True, "w3": False}) as (ports, resumed):
        done = await resume("tenant-a", ports["w2"])
    assert done.returncode == 0, done.stderr
    assert resumed == {"w1": ["tenant-a"], "w2": ["tenant-a"], "w3": []}
    assert "resumed in 4 sink instance(s)" in done.stdout


async def test_an_unreachable_member_is_named_and_fails_the_command_after_the_others_resumed() -> None:
    async with workers({"w1": True, "w2": True}, silent=frozenset({"w2"})) as (ports, resumed):
        done = await resume("tenant-a", ports["w1"])
    assert done.returncode == 1
    assert resumed["w1"] == ["tenant-a"]
    assert f"cannot reach http://127.0.0.1:{ports['w2']}/endpoints/tenant-a/resume" in done.stderr
    assert "resumed in 2 sink instance(s)" in done.stdout


async def test_no_worker_knowing_the_endpoint_is_an_error_naming_it() -> None:
    async with workers({"w1": False, "w2": False}) as (ports, _):
        done = await resume("nobody", ports["w1"])
    assert done.returncode == 1
    assert "knows endpoint 'nobody'" in done.stderr
