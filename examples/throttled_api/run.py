"""Three classes of jobs (weights 5:3:1) sharing one API limit against a local endpoint.

The endpoint counts requests per second per class (header ``X-Quota-Class``). Each class has a few
jobs; every job throttles each request through its own prefetching client (``throttle(1)``) before
POSTing. The controller runs in-process (``egress run``'s default transport); with ``--service URL``
the jobs use a running ``egress throttler serve --dynamic-spec examples/throttled_api/dynamic_spec.yaml``
instead. At the end the script prints measured shares next to the ideal and writes a PNG chart of
the shares per second. Every class is backlogged the whole time, so shares should follow the weights.

    .venv/bin/python -m examples.throttled_api.run [--seconds 20] [--chart throttled_api.png]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter, defaultdict
from pathlib import Path

import aiohttp
from aiohttp import web

from egress.clock import RealClock
from egress.throttler.controller import ThrottlerController
from egress.throttler.factory import ThrottlerFactory
from egress.throttler.http_transport import HttpTransport
from egress.throttler.service import load_throttlers
from egress.throttler.transport import InProcessTransport, QuotaTransport

HERE = Path(__file__).resolve().parent
THROTTLER = "external_api"
JOBS_PER_CLASS = 4


class Endpoint:
    """A local API that counts requests per whole second per class."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.counts: dict[int, Counter[str]] = defaultdict(Counter)

    async def handle(self, request: web.Request) -> web.Response:
        second = int(time.monotonic() - self.started)
        self.counts[second][request.headers.get("X-Quota-Class", "?")] += 1
        return web.Response(text="ok")


async def run(seconds: float, chart: Path, service: str | None) -> dict[str, float]:
    throttlers = load_throttlers(HERE / "dynamic_spec.yaml")
    weights = {c: s.weight for c, s in throttlers[THROTTLER].classes.items()}
    clock = RealClock()
    endpoint = Endpoint()
    app = web.Application()
    app.router.add_post("/api", endpoint.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/api"  # type: ignore[union-attr]

    controller = ThrottlerController(throttlers, clock) if service is None else None
    transport: QuotaTransport = InProcessTransport(controller) if controller else HttpTransport(service or "")
    # One factory per class, as one computation per class would have (its class id per throttler).
    factories = {c: ThrottlerFactory(transport, clock, throttlers, class_ids={THROTTLER: c}, client_id=c)
                 for c in weights}
    stop = asyncio.Event()

    async def job(class_id: str, session: aiohttp.ClientSession) -> None:
        handle = factories[class_id].get_throttler_or_throw(THROTTLER)
        while not stop.is_set():
            await handle.throttle(1)
            async with session.post(url, data=b"{}", headers={"X-Quota-Class": class_id}) as response:
                await response.read()

    endpoint.started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        jobs = [asyncio.create_task(job(c, session)) for c in weights for _ in range(JOBS_PER_CLASS)]
        await asyncio.sleep(seconds)
        stop.set()
        for task in jobs:
            task.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
    for factory in factories.values():
        await factory.aclose()
    await transport.aclose()
    if controller is not None:
        await controller.aclose()
    await runner.cleanup()

    # Shares after the first second (the initial burst goes to whoever asks first).
    seconds_seen = sorted(s for s in endpoint.counts if 1 <= s < int(seconds))
    totals: Counter[str] = Counter()
    for second in seconds_seen:
        totals.update(endpoint.counts[second])
    total = sum(totals.values())
    weight_sum = sum(weights.values())
    print(f"{total} requests in {len(seconds_seen)} s after the first: {total / max(1, len(seconds_seen)):.1f}/s "
          f"(limit {throttlers[THROTTLER].limit:g}/s)")
    print(f"{'class':<10}{'weight':>8}{'ideal':>10}{'measured':>10}")
    shares = {}
    for class_id, weight in weights.items():
        shares[class_id] = totals[class_id] / total if total else 0.0
        print(f"{class_id:<10}{weight:>8g}{weight / weight_sum:>10.3f}{shares[class_id]:>10.3f}")
    draw(chart, endpoint.counts, weights, int(seconds))
    print(f"chart: {chart}")
    return shares


def draw(chart: Path, counts: dict[int, Counter[str]], weights: dict[str, float], seconds: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(seconds))
    weight_sum = sum(weights.values())
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for class_id, weight in weights.items():
        per_second = [counts.get(s, Counter())[class_id] for s in xs]
        totals = [sum(counts.get(s, Counter()).values()) or 1 for s in xs]
        top.plot(xs, per_second, label=f"{class_id} (weight {weight:g})")
        line = bottom.plot(xs, [p / t for p, t in zip(per_second, totals, strict=True)], label=class_id)
        bottom.axhline(weight / weight_sum, linestyle="--", color=line[0].get_color(), linewidth=0.8)
    top.set_ylabel("requests / s")
    top.set_title("One API limit shared by three quota classes (egress distributed throttler)")
    top.legend()
    bottom.set_ylabel("share (dashed: ideal)")
    bottom.set_xlabel("second")
    bottom.set_ylim(0, 1)
    figure.tight_layout()
    figure.savefig(chart, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description="Three quota classes 5:3:1 sharing one API limit.")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--chart", type=Path, default=Path("throttled_api.png"))
    parser.add_argument("--service", help="URL of `egress throttler serve` (default: in-process controller)")
    args = parser.parse_args()
    asyncio.run(run(args.seconds, args.chart, args.service))


if __name__ == "__main__":
    main()
