"""Distributed throttler: scheduler speed, service RPC rate, fairness, utilisation, wake-up latency,
and what a Python user would use instead (the ``limits`` library's moving window on Redis).

What one run measures (issue 5's list), printing one line each and one comparable summary line:

1. ``scheduler``: decisions/s of the pure quota queue (token bucket + SFQ over 3 classes, lag heaps)
   in this process, one core: 300,000 requests of 1 unit (chunks of at most 1) submitted, then
   granted; a decision = one chunk chosen, charged and resolved. Target >= 50,000/s. Then the cost
   of one timer tick (poll + next deadline) granting one request with 100 / 10,000 / 100,000 waiting.
2. ``service``: ``egress throttler serve`` in a subprocess (unlimited throttler), 100 concurrent
   clients (aiohttp, one session, this process) looping ``RequestQuota`` for ``--seconds``: RPCs/s
   (target >= 1,000/s) and latency; then the same 100 clients paced at 10 RPCs/s each (1,000/s
   offered): p50/p99 latency (target p99 <= 10 ms). The closed loop's latency is queueing in the
   client process (Little's law: 100 in flight / rate), so the paced figure is the service's.
3. ``shares``: limit 1000/s, period 1 s, ``max_grant_amount`` 100, classes 5:3:1 all backlogged
   (20 workers per class each asking 100 units in a loop) for 60 s on the virtual clock; measured shares, and
   the largest deviation ``|W_i - (w_i/Σw)·W|`` over every interval between two grants against the
   SFQ bound ``m·(1 + n·w_i/Σw)``. These are the controller's chunks; what prefetching clients' callers
   get (every window's share, the longest gap) is measured by ``tests/unit/throttler/test_saturation.py``
   and ``tests/e2e/throttler/test_weighted_saturation.py`` with :mod:`egress.throttler.shares`.
4. ``utilisation``: the same run, (granted − initial burst) / (limit · 60 s). Target >= 99 %.
5. ``waking class``: ``bulk`` idles while ``vip`` is backlogged for 30 s, then wakes; seconds to its
   first grant against ``n·m/limit``.
6. ``envelope``: what callers of ``throttle()`` receive, at the point of use: 30 prefetching clients
   (10 per class 5:3:1), 20 callers each asking 1–20 units after exponential pauses (mean 2 s:
   about three times the limit offered), ``max_grant_amount`` 50, limit 1000/s then 600/s from
   10 s, the controller restarted at 20 s (0.5 s away, restart horizon in a file), 30 s on the
   virtual clock; the worst excess (units) over ``∫limit dt + limit·period`` over every window.
   Must be 0 (within float rounding).
7. ``limits+redis``: ``limits.MovingWindowRateLimiter`` on ``RedisStorage`` (Debian's
   ``redis-server``, started here on a free 127.0.0.1 port and stopped at the end): ``hit()``
   decisions/s from one client, and whether the allowed hits keep the envelope
   ``limit·T + limit·period`` over every window (limit 1000 per 1 s, hammered for 3 s).

Run from the repository root::

    .venv/bin/python benchmarks/throttler.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from egress.clock import VirtualClock  # noqa: E402
from egress.throttler.controller import ThrottlerController  # noqa: E402
from egress.throttler.envelope import RateSteps, worst_excess  # noqa: E402
from egress.throttler.factory import ThrottlerFactory  # noqa: E402
from egress.throttler.http_transport import HttpTransport  # noqa: E402
from egress.throttler.models import ThrottlerSpec  # noqa: E402
from egress.throttler.queue import QuotaQueue  # noqa: E402
from egress.throttler.transport import InProcessTransport  # noqa: E402

WEIGHTS = {"vip": 5.0, "regular": 3.0, "bulk": 1.0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_scheduler(count: int = 300_000) -> float:
    spec = ThrottlerSpec.model_validate({"limit": 1e12, "period": "1s", "max_grant_amount": 1,
                                         "classes": {c: {"weight": w} for c, w in WEIGHTS.items()}})
    queue = QuotaQueue(spec, now=0.0)
    classes = list(WEIGHTS)
    started = time.perf_counter()
    for i in range(count):
        queue.submit(1, 0.0, timestamp=float(i % 977), class_id=classes[i % 3])
    resolved = queue.poll(1.0)
    elapsed = time.perf_counter() - started
    assert len(resolved) == count, len(resolved)
    return count / elapsed


def bench_grant_cost(sizes: tuple[int, ...] = (100, 10_000, 100_000)) -> dict[int, float]:
    """Microseconds per grant with ``n`` requests waiting in one class (heap: O(log n))."""
    spec = ThrottlerSpec.model_validate({"limit": 1000, "period": "1s", "max_grant_amount": 1})
    result = {}
    for size in sizes:
        queue = QuotaQueue(spec, now=0.0)
        queue.bucket.take(1000, 0.0)
        for i in range(size):
            queue.submit(1, 0.0, timestamp=float((i * 7919) % size))
        grants = min(size, 5000)
        started = time.perf_counter()
        for k in range(grants):  # one timer tick per grant, as the controller does
            now = (k + 1) / 1000
            queue.poll(now)
            queue.next_ready(now)
        result[size] = (time.perf_counter() - started) / grants * 1e6
    return result


async def bench_service(seconds: float, clients: int = 100, paced: float | None = None) -> tuple[float, float, float]:
    """RPCs/s, p50 and p99 (seconds): closed loop (each client asks again at once) or, with
    ``paced``, each client asking ``paced`` times per second (an open load of ``clients × paced``/s)."""
    with tempfile.TemporaryDirectory() as tmp:
        dynamic = Path(tmp) / "dynamic.yaml"
        dynamic.write_text(yaml.safe_dump({"throttlers": {"open": {}}}))
        port = free_port()
        code = "import sys; from egress.cli.throttler import throttler_app; sys.argv[0] = 'egress'; throttler_app()"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        server = subprocess.Popen([sys.executable, "-c", code, "serve", "--dynamic-spec", str(dynamic),  # noqa: ASYNC220
                                   "--port", str(port)], env=env, stderr=subprocess.DEVNULL)
        try:
            transport = HttpTransport(f"http://127.0.0.1:{port}")
            for _ in range(200):
                try:
                    await transport.request_quota("open", 1, timestamp=0, quota_class_id=None, client_id="w",
                                                  rpc_timeout=1)
                    break
                except Exception:
                    await asyncio.sleep(0.05)
            latencies: list[float] = []
            warm_until = time.perf_counter() + 1.0  # the first second opens 100 connections: not counted
            deadline = warm_until + seconds

            async def client(index: int) -> None:
                next_start = time.perf_counter() + (index / clients / paced if paced else 0.0)
                while time.perf_counter() < deadline:
                    if paced:
                        await asyncio.sleep(max(0.0, next_start - time.perf_counter()))
                        next_start += 1.0 / paced
                    started = time.perf_counter()
                    await transport.request_quota("open", 1, timestamp=0, quota_class_id=None,
                                                  client_id=f"c{index}", rpc_timeout=30)
                    if started >= warm_until:
                        latencies.append(time.perf_counter() - started)

            await asyncio.gather(*(client(i) for i in range(clients)))
            elapsed = time.perf_counter() - warm_until
            await transport.aclose()
        finally:
            server.terminate()
            server.wait(10)
    latencies.sort()
    return len(latencies) / elapsed, latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]


async def bench_shares(horizon: float = 60.0) -> dict[str, Any]:
    clock = VirtualClock()
    spec = ThrottlerSpec.model_validate({"limit": 1000, "period": "1s", "max_grant_amount": 100,
                                         "classes": {c: {"weight": w} for c, w in WEIGHTS.items()}})
    controller = ThrottlerController({"api": spec}, clock)
    chunks: list[tuple[float, str, float]] = []
    controller.queue("api")._on_chunk = lambda request, chunk, now: chunks.append((now, request.class_id, chunk))

    async def worker(class_id: str) -> None:
        while True:
            await controller.request_quota("api", 100, quota_class_id=class_id, timestamp=clock.now())

    # 20 workers × 100 units per class: 2,000 units asked > the 1,000-unit burst, so every class
    # stays backlogged from the first grant on (the bound holds only while classes are backlogged).
    tasks = [asyncio.create_task(worker(c)) for c in WEIGHTS for _ in range(20)]
    await clock.advance(horizon)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await controller.aclose()
    utilisation = (sum(x for _, _, x in chunks) - 1000.0) / (1000.0 * horizon)
    # The 1,000-unit burst at t = 0 goes to whoever asks first, before every class is backlogged:
    # shares and deviations are measured from the first grant after it.
    chunks = [c for c in chunks if c[0] > 0.0]
    granted = {c: sum(x for _, k, x in chunks if k == c) for c in WEIGHTS}
    total = sum(granted.values())
    weight_sum, n, m = sum(WEIGHTS.values()), len(WEIGHTS), 100.0
    # largest deviation over every interval [chunk a, chunk b): prefix sums, O(chunks²) is too much:
    # the deviation of an interval is the difference of two prefix deviations, so max - min of prefixes.
    worst_ratio, worst = 0.0, {}
    for c, w in WEIGHTS.items():
        share = w / weight_sum
        prefix, lo, hi = 0.0, 0.0, 0.0
        for _, k, x in chunks:
            prefix += (x if k == c else 0.0) - share * x
            lo, hi = min(lo, prefix), max(hi, prefix)
        bound = m * (1 + n * share)
        worst[c] = (hi - lo, bound)
        worst_ratio = max(worst_ratio, (hi - lo) / bound)
    return {"shares": {c: granted[c] / total for c in WEIGHTS}, "worst": worst, "worst_ratio": worst_ratio,
            "utilisation": utilisation}


async def bench_waking(idle: float = 30.0) -> tuple[float, float]:
    clock = VirtualClock()
    spec = ThrottlerSpec.model_validate({"limit": 1000, "period": "1s", "max_grant_amount": 100,
                                         "classes": {c: {"weight": w} for c, w in WEIGHTS.items()}})
    controller = ThrottlerController({"api": spec}, clock)

    async def busy() -> None:
        while True:
            await controller.request_quota("api", 100, quota_class_id="vip")

    tasks = [asyncio.create_task(busy()) for _ in range(3)]
    await clock.advance(idle)
    woke = clock.monotonic()
    late = asyncio.create_task(controller.request_quota("api", 100, quota_class_id="bulk"))
    while not late.done():
        await clock.advance(0.001)
    first = clock.monotonic() - woke
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await controller.aclose()
    return first, len(WEIGHTS) * 100 / 1000


async def bench_envelope(horizon: float = 30.0, change_at: float = 10.0, restart_at: float = 20.0) -> dict[str, float]:
    """Worst excess (units) of the units handed to callers over the envelope, and the share of the
    envelope's ``∫limit dt`` they used (see the module docstring, item 6)."""
    clock = VirtualClock()
    rng = random.Random(7)

    def spec(limit: float) -> dict[str, ThrottlerSpec]:
        return {"api": ThrottlerSpec.model_validate({
            "limit": limit, "period": "100ms", "request_period": "200ms", "max_grant_amount": 50,
            "classes": {c: {"weight": w} for c, w in WEIGHTS.items()},
            "retrying_channel": {"retry_backoff_time": "100ms", "enable_exponential_retry_backoffs": False}})}

    specs = spec(1000.0)
    releases: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "throttler-horizon.json"
        transport = InProcessTransport(ThrottlerController(specs, clock, state_file=state))
        factories = [ThrottlerFactory(transport, clock, specs, class_ids={"api": class_id}, client_id=f"{class_id}{i}")
                     for class_id in WEIGHTS for i in range(10)]

        async def caller(factory: ThrottlerFactory) -> None:
            handle = factory.get_throttler_or_throw("api")
            while True:
                await clock.sleep(rng.expovariate(0.5))
                amount = rng.randint(1, 20)
                await handle.throttle(amount)
                releases.append((clock.monotonic(), float(amount)))

        async def change_and_restart() -> None:
            await clock.sleep_until(change_at)
            specs.update(spec(600.0))
            transport.controller.reconfigure(specs)
            for factory in factories:
                factory.reconfigure(specs)
            await clock.sleep_until(restart_at)
            await transport.controller.aclose()
            await clock.sleep(0.5)
            transport.controller = ThrottlerController(specs, clock, state_file=state)

        async with clock.autojumping():
            tasks = [asyncio.create_task(caller(f)) for f in factories for _ in range(20)]
            tasks.append(asyncio.create_task(change_and_restart()))
            await clock.sleep_until(horizon)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for factory in factories:
            await factory.aclose()
        await transport.controller.aclose()
    limit = RateSteps([(0.0, 1000.0), (change_at, 600.0)])
    return {"excess": max(0.0, worst_excess(releases, limit, 100.0)),
            "used": sum(u for _, u in releases) / (limit.cumulative(horizon) + 100.0),
            "calls": float(len(releases))}


def bench_limits_redis(seconds: float = 3.0) -> tuple[float, bool, int] | str:
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        return "redis-server not installed (apt-get install -y redis-server)"
    try:
        from limits import parse
        from limits.storage import RedisStorage
        from limits.strategies import MovingWindowRateLimiter
    except ImportError:
        return "the limits and redis packages are not installed"
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen([redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
        try:
            storage = None
            for _ in range(100):
                try:
                    storage = RedisStorage(f"redis://127.0.0.1:{port}")
                    if storage.check():
                        break
                except Exception:
                    pass
                time.sleep(0.05)
            assert storage is not None
            limiter = MovingWindowRateLimiter(storage)
            item = parse("1000/second")
            allowed: list[float] = []
            calls = 0
            started = time.perf_counter()
            while time.perf_counter() - started < seconds:
                calls += 1
                if limiter.hit(item, "api"):
                    allowed.append(time.perf_counter())
            elapsed = time.perf_counter() - started
        finally:
            server.terminate()
            server.wait(10)
    keeps = True
    j = 0
    for i, t1 in enumerate(allowed):  # windows starting at an allowed hit: count within [t1, t1 + T]
        for T in (0.001, 0.1, 0.5, 1.0, 2.0):
            j = i
            while j < len(allowed) and allowed[j] <= t1 + T:
                j += 1
            if j - i > 1000 * T + 1000 * 1.0:
                keeps = False
        if i > 5000:
            break
    return calls / elapsed, keeps, len(allowed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="Duration of the service phase.")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}", flush=True)
    decisions = bench_scheduler()
    print(f"scheduler: {decisions:,.0f} decisions/s (target >= 50,000)", flush=True)
    costs = bench_grant_cost()
    print("grant cost by waiters: " + ", ".join(f"{n:,} waiting {us:.1f} µs" for n, us in costs.items()), flush=True)
    rps, p50, p99 = asyncio.run(bench_service(args.seconds))
    print(f"service, closed loop: {rps:,.0f} RequestQuota/s with 100 clients, p50 {p50 * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms (target >= 1,000/s)", flush=True)
    paced_rps, paced_p50, paced_p99 = asyncio.run(bench_service(args.seconds, paced=10.0))
    print(f"service, 100 clients × 10/s: {paced_rps:,.0f} RequestQuota/s, p50 {paced_p50 * 1000:.1f} ms, "
          f"p99 {paced_p99 * 1000:.1f} ms (target p99 <= 10 ms)", flush=True)
    shares = asyncio.run(bench_shares())
    share_text = " / ".join(f"{c} {v:.4f}" for c, v in shares["shares"].items())
    print(f"shares 5:3:1 (ideal 0.5556 / 0.3333 / 0.1111): {share_text}", flush=True)
    for c, (dev, bound) in shares["worst"].items():
        print(f"  {c}: largest deviation over any interval {dev:.1f} units, bound m(1+n·w/Σw) = {bound:.1f}")
    print(f"utilisation (demand above limit, 60 s): {shares['utilisation'] * 100:.2f} % (target >= 99 %)", flush=True)
    first, expected = asyncio.run(bench_waking())
    print(f"waking class: first grant after {first:.3f} s (n·m/limit = {expected:.3f} s)", flush=True)
    envelope = asyncio.run(bench_envelope())
    print(f"envelope at the point of use: worst excess {envelope['excess']:.6f} units over limit·T + limit·period "
          f"({envelope['calls']:,.0f} calls of 600 callers on 30 clients, classes 5:3:1, max_grant_amount 50, "
          f"limit 1000 → 600/s at 10 s, controller restarted at 20 s; {envelope['used'] * 100:.1f} % of the "
          "envelope used)", flush=True)
    limits_result = bench_limits_redis()
    if isinstance(limits_result, str):
        limits_text = f"limits+redis skipped: {limits_result}"
    else:
        limits_rate, keeps, allowed = limits_result
        limits_text = (f"limits+redis moving window {limits_rate:,.0f} decisions/s, "
                       f"envelope {'kept' if keeps else 'BROKEN'} ({allowed} allowed)")
    print(limits_text, flush=True)
    worst = max(dev / bound for dev, bound in shares["worst"].values())
    print(f"throttler: scheduler {decisions:,.0f} decisions/s | service {rps:,.0f} RequestQuota/s (100 clients), "
          f"p99 {paced_p99 * 1000:.1f} ms at {paced_rps:,.0f}/s | 5:3:1 {share_text}, worst deviation "
          f"{worst:.2f}× bound | utilisation "
          f"{shares['utilisation'] * 100:.2f} % | waking {first:.3f} s vs {expected:.3f} s | worst excess over the "
          f"envelope {envelope['excess']:.6f} units | {limits_text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
