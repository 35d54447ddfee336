"""Weighted classes at saturation and a cancelled chunked request, with real processes.

``egress throttler serve`` is a real process; the callers are prefetching clients over HTTP in two
other processes (each holds one client per class, so a pause of either process stalls both classes
alike), reporting every ``throttle(1)`` that returned to a receiver here. Shares and gaps are
measured on the grants' own timeline (the units granted before each one, in the order the receiver
saw them), so a loaded machine slows the run without changing what is measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from egress.clock import RealClock
from egress.throttler.client import PrefetchingClient
from egress.throttler.errors import ThrottlerError
from egress.throttler.http_transport import HttpTransport
from egress.throttler.service import load_throttlers
from egress.throttler.shares import longest_gap, share_range, units_timeline
from tests.e2e.throttler_support import launch, launch_callers
from tests.waiting import eventually

pytestmark = pytest.mark.e2e

LIMIT, REQUEST_PERIOD = 100.0, 0.1
WARM_UP, MEASURED = 200, 900  # units: the first two seconds at the limit, then nine
DEADLINE = 60.0  # seconds: a failure guard only


def write_dynamic(path: Path, **throttler: Any) -> Path:
    path.write_text(yaml.safe_dump({"throttlers": {"q": throttler}}))
    return path


async def collect(port_ready: asyncio.Future[int], count: int) -> list[tuple[str, float]]:
    """A receiver: ``(class, 1 unit)`` per line from every connection, in arrival order, until
    ``count`` lines came; then it closes every connection (the callers' signal to stop)."""
    lines: list[tuple[str, float]] = []
    done = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while not done.is_set() and (line := await reader.readline()):
            lines.append((line.decode().strip(), 1.0))
            if len(lines) >= count:
                done.set()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port_ready.set_result(server.sockets[0].getsockname()[1])
    try:
        await asyncio.wait_for(done.wait(), DEADLINE)
    finally:
        for writer in writers:
            writer.close()
        server.close()
    return lines[:count]


def stop(process: subprocess.Popen[Any], *, signal_first: bool = True) -> None:
    """Stop ``process``: SIGTERM (or, with ``signal_first=False``, first 10 s to end by itself),
    SIGKILL after 10 s more."""
    if not signal_first:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a stuck process fails the test below
        process.kill()
        process.wait()


async def test_saturated_classes_9_to_1_share_by_weight_and_the_light_one_never_waits_long(tmp_path: Path) -> None:
    dynamic = write_dynamic(tmp_path / "dynamic.yaml", limit=LIMIT, period="1s", request_period="100ms",
                            max_grant_amount=5, classes={"heavy": {"weight": 9.0}, "light": {"weight": 1.0}},
                            retrying_channel={"retry_backoff_time": "50ms", "max_backoff_time": "200ms"})
    service, port = launch(dynamic)
    port_ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    receiving = asyncio.create_task(collect(port_ready, WARM_UP + MEASURED))
    receiver = await port_ready
    callers = [launch_callers(dynamic, port, receiver, f"p{i}", classes=["heavy", "light"], callers=16)
               for i in range(2)]
    try:
        lines = await receiving
    finally:
        for process in callers:
            stop(process, signal_first=False)  # they end once the receiver closes their connections
        stop(service)
    assert [process.returncode for process in callers] == [0, 0]
    timeline = units_timeline(lines[WARM_UP:])
    # 5 s at the limit are 500 units; 3 request periods at the limit are 30 units. Before the fix:
    # lumps of 16 light units every 160 units.
    lowest, highest = share_range(timeline, "light", 5 * LIMIT)
    print(f"light share over every 500 units: {lowest:.3f}–{highest:.3f}; "
          f"longest gap {longest_gap(timeline, 'light'):g} units")
    assert 0.08 <= lowest <= highest <= 0.12, (lowest, highest)
    assert longest_gap(timeline, "light") <= 3 * REQUEST_PERIOD * LIMIT


async def metric(session: aiohttp.ClientSession, port: int, name: str, quota_class: str) -> float:
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    found = re.search(rf'^{name}{{[^}}]*quota_class="{quota_class}"[^}}]*}} (\S+)$', text, re.MULTILINE)
    assert found, f"{name} for {quota_class} not in /metrics"
    return float(found.group(1))


async def test_a_cancelled_chunked_request_gives_back_all_it_holds_so_the_next_request_of_3_does_not_wait(
    tmp_path: Path,
) -> None:
    # Heavy saturates the bucket, so it never fills up while the big light request holds its chunks.
    # The next light request (another job of the class) waits behind it at the service, so it is
    # decided in the same instant as the cancel, before heavy's next RPC can take what came back.
    limit = 2.0
    dynamic = write_dynamic(tmp_path / "dynamic.yaml", limit=limit, period="4s", request_period="100ms",
                            max_grant_amount=5, classes={"heavy": {"weight": 1.0}, "light": {"weight": 1.0}})
    service, port = launch(dynamic)
    spec = load_throttlers(dynamic)["q"]
    transports = [HttpTransport(f"http://127.0.0.1:{port}") for _ in range(3)]
    heavy, light, next_light = (PrefetchingClient("q", spec, transport, RealClock(), client_id=class_id,
                                                  class_id=class_id.removeprefix("next_"))
                                for transport, class_id in zip(transports, ("heavy", "light", "next_light"),
                                                               strict=True))
    stopping = asyncio.Event()

    async def heavy_caller() -> None:
        while not stopping.is_set():
            await heavy.throttle(1)

    heavy_callers = [asyncio.create_task(heavy_caller()) for _ in range(16)]
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + DEADLINE

            async def metric_reaches(name: str, quota_class: str, condition: Callable[[float], bool],
                                     what: str) -> float:
                async def reached() -> list[float]:  # the value in a list: a value of 0 may be an answer too
                    value = await metric(session, port, name, quota_class)
                    return [value] if condition(value) else []

                found = await eventually(reached, what=what, timeout=max(0.0, deadline - time.monotonic()),
                                         interval=0.05)
                return found[0]

            # the burst is spent once heavy waits at the service
            await metric_reaches("egress_throttler_class_pending_requests", "heavy", lambda n: n >= 1, "heavy waiting")
            big = asyncio.create_task(light.throttle(40, timestamp=0.0))
            await metric_reaches("egress_throttler_class_granted_total", "light", lambda n: n >= 5, "a light chunk")
            following = asyncio.create_task(next_light.throttle(3, timestamp=1.0))  # behind big: less lagging
            await metric_reaches("egress_throttler_class_pending_requests", "light", lambda n: n >= 2,
                                 "light behind big")
            # Heavy takes the tokens as they come; a bound that decays with the time since the last
            # chunk (5 units at 2/s: gone after 2.5 s) gives back nothing from then on. The next light
            # chunk comes 5 s after the first.
            await asyncio.sleep(3.0)
            held = await metric(session, port, "egress_throttler_class_granted_total", "light")
            cancelled_at = time.monotonic()
            big.cancel()
            await asyncio.gather(big, return_exceptions=True)
            await asyncio.wait_for(following, DEADLINE)
            waited = time.monotonic() - cancelled_at
            refunded = await metric(session, port, "egress_throttler_class_refunded_total", "light")
    finally:
        stopping.set()
        for task in heavy_callers:
            task.cancel()
        await asyncio.gather(*heavy_callers, return_exceptions=True)
        for client in (heavy, light, next_light):
            await client.aclose(ThrottlerError("the test is over"))
        for transport in transports:
            await transport.aclose()
        stop(service)
    assert refunded >= held >= 5
    # Served from what came back, at once (4 ms measured); without it the 3 units come from the
    # refill at 2/s (0.93 s measured before the fix).
    assert waited < 0.5, waited
