"""Webhook fan-out isolation (issue 27, point 5): the ``webhook_http`` sink delivering to 1,000
endpoints on loopback, once with every endpoint healthy and once with one endpoint down for a
while and one answering slowly; the healthy endpoints' delivery latency is compared between the two.

The endpoints: 998 paths of one nginx (``location /hooks/ { return 200; }``, one worker); the slow
one is ``egress receiver --delay SLOW`` on its own port; the down one is another ``egress receiver``
answering 503 to its path (``--fail-path``) until ``--down-for`` seconds into the run, when it is
told to answer again (``POST /fail-path?...&up=1``). Both receivers start before the run in both
runs (so their start-up CPU is outside both); in the baseline the two endpoints point at nginx.

The sink runs alone in this process (one partition's instance, as a partition job holds it), fed
``--rate`` messages a second for ``--seconds`` in ticks of 10 ms, each to a random endpoint with
one of 8 keys per endpoint; its outbox is kept in memory and handed to it as ``read_outbox`` (the
SQLite engine's ``OutboxReader``). A message's delivery latency is from ``distribute`` to its 2xx.
CPU per message counts this process and its children (nginx, the receivers).

Checks (exit 1 when one fails): every message acknowledged (the partition-wide prefix reaches the
last seq) in both runs; every message of the bad endpoints delivered once they answer, the first
deliveries of each key in seq order (the receivers' records, by ``webhook-id``); the healthy
endpoints' p99 in the bad run within 20 % of the baseline's: the median of the pairs' ratios (the two
runs of a pair in alternating order, so that a drift of a shared machine's load favours neither).

    python benchmarks/webhooks.py [--seconds 30] [--rate 1000] [--down-for 15] [--slow 2] [--pairs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from delivery import NginxTarget, find_or_install_nginx, free_port, read_line, stop_process
from egress.clock import RealClock
from egress.connectors.base import SinkContext
from egress.connectors.sinks.webhook_endpoints import Delivery
from egress.connectors.sinks.webhook_http import WebhookHttpSink
from egress.connectors.sinks.webhook_parameters import WebhookSinkDynamicParameters, WebhookSinkParameters
from egress.engines import OutboxMessage, SinkProgress
from egress.keys import idempotency_key
from egress.observe import Metrics, StatusTree

ENDPOINTS = 1000
KEYS_PER_ENDPOINT = 8
TICK = 0.01
SECRET = "whsec_" + base64.b64encode(b"benchmark-secret-0123456789abcdef").decode()
DOWN, SLOW = "e0000", "e0001"


class HooksNginx(NginxTarget):
    """``benchmarks/delivery.py``'s nginx; every path answers 200."""

    log_format = "$http_webhook_id $status $request_length"


def start_receiver(port: int, record: Path, *options: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-m", "egress", "receiver", "--port", str(port), "--record",
                                str(record), "--idempotency-header", "webhook-id", *options],
                               stdout=subprocess.PIPE, text=True)
    line = read_line(process, 30)
    if "listening" not in line:
        raise RuntimeError(f"egress receiver did not start: {line!r}")
    return process


class Measured(WebhookHttpSink):
    """The sink, recording each 2xx's latency by endpoint (benchmark instrumentation only)."""

    latencies: dict[str, list[float]]

    def _acknowledge(self, delivery: Delivery) -> None:
        super()._acknowledge(delivery)
        self.latencies[delivery.endpoint.name].append(self._context.clock.monotonic() - delivery.started)


async def phase(urls: dict[str, str], secret_file: Path, seconds: float, rate: int, seed: int,
                on_tick: Any = None) -> tuple[Measured, list[OutboxMessage], float]:
    clock = RealClock()
    reported: list[SinkProgress] = [SinkProgress()]
    outbox: list[OutboxMessage] = []

    async def read_outbox(after: int, last: int) -> list[OutboxMessage]:
        return outbox[after:last]  # seq n is outbox[n - 1]

    context = SinkContext("fanout", "hooks", 0, clock, Metrics(), StatusTree(), reported.append,
                          read_outbox=read_outbox)
    dynamic = WebhookSinkDynamicParameters.model_validate({
        "retry_initial_delay": "200ms", "retry_minimum_delay": "100ms", "retry_maximum_delay": "2s",
        "breaker": {"open_for": "2s"},
        "endpoints": {name: {"url": url, "secret_file": str(secret_file), "max_in_flight": 4 if name == SLOW else 1}
                      for name, url in urls.items()}})
    sink = Measured(context, WebhookSinkParameters.model_validate(
        {"payload_column": "payload", "endpoint_column": "endpoint"}), dynamic, SinkProgress())
    sink.latencies = collections.defaultdict(list)
    names = sorted(urls)
    rng = random.Random(seed)
    per_tick = max(1, round(rate * TICK))
    started = clock.monotonic()
    ticks = int(seconds / TICK)
    for tick in range(ticks):
        batch = []
        for _ in range(per_tick):
            seq = len(outbox) + 1
            name = names[rng.randrange(len(names))]
            key = f"{name}/k{rng.randrange(KEYS_PER_ENDPOINT)}"
            payload = json.dumps({"seq": seq, "key": key, "pad": "x" * 160})
            message = OutboxMessage(seq, "events", seq.to_bytes(8, "big"), key.encode(), None,
                                    {"endpoint": name, "payload": payload})
            outbox.append(message)
            batch.append(message)
        sink.distribute(batch)
        if on_tick is not None:
            on_tick(tick * TICK)
        await clock.sleep_until(started + (tick + 1) * TICK)
    sent_for = clock.monotonic() - started
    deadline = clock.monotonic() + 180
    while reported[-1].max_persisted_seq_no < len(outbox) and clock.monotonic() < deadline:
        await clock.sleep(0.05)
    await sink.close()
    return sink, outbox, sent_for


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def check_order(record: Path, outbox: list[OutboxMessage], name: str) -> str | None:
    """None when every message of endpoint ``name`` was delivered and, per key, first in seq order."""
    expected = {idempotency_key(m.message_id): m for m in outbox if m.row["endpoint"] == name}
    first: dict[str, float] = {}
    for line in record.read_text().splitlines():
        entry = json.loads(line)
        if entry["status"] == 200 and entry["idempotency_key"] not in first:
            first[entry["idempotency_key"]] = entry["time"]
    missing = expected.keys() - first.keys()
    if missing:
        return f"{name}: {len(missing)} of {len(expected)} messages never delivered"
    by_key: dict[bytes, list[tuple[int, float]]] = collections.defaultdict(list)
    for key, message in expected.items():
        by_key[message.key].append((message.seq, first[key]))
    for key, pairs in by_key.items():
        times = [t for _, t in sorted(pairs)]
        if times != sorted(times):
            return f"{name}: key {key.decode()} delivered out of seq order"
    return None


def run(args: argparse.Namespace, work: Path, nginx_binary: str, bad: bool) -> dict[str, Any]:
    nginx = HooksNginx(nginx_binary, work / ("bad" if bad else "baseline"))
    nginx.start()
    base = nginx.url.removesuffix("/events")
    urls = {f"e{i:04d}": f"{base}/hooks/e{i:04d}" for i in range(ENDPOINTS)}
    secret_file = work / "secret"
    secret_file.write_text(SECRET + "\n")
    processes: list[subprocess.Popen[str]] = []
    slow_record, down_record = work / f"slow-{bad}.jsonl", work / f"down-{bad}.jsonl"
    slow_port, down_port = free_port(), free_port()
    processes.append(start_receiver(slow_port, slow_record, "--delay", str(args.slow)))
    processes.append(start_receiver(down_port, down_record, "--fail-path", f"/hooks/{DOWN}"))
    if bad:
        urls[SLOW] = f"http://127.0.0.1:{slow_port}/hooks/{SLOW}"
        urls[DOWN] = f"http://127.0.0.1:{down_port}/hooks/{DOWN}"
    healed: list[Any] = []

    def heal() -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{down_port}/fail-path?path=/hooks/{DOWN}&up=1",
                                         method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def on_tick(at: float) -> None:
        if bad and at >= args.down_for and not healed:  # in a thread: the loop goes on meanwhile
            healed.append(asyncio.get_running_loop().run_in_executor(None, heal))

    cpu = time.process_time()
    wall = time.perf_counter()
    try:
        sink, outbox, sent_for = asyncio.run(phase(urls, secret_file, args.seconds, args.rate, args.seed, on_tick))
    finally:
        for process in processes:
            stop_process(process)
        nginx.stop()
    own = time.process_time() - cpu
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    result: dict[str, Any] = {
        "messages": len(outbox), "sent_for": sent_for, "wall": time.perf_counter() - wall, "own_cpu": own,
        "children_cpu_total": children.ru_utime + children.ru_stime,
        "acknowledged": sink.progress().max_persisted_seq_no,
        "good": [v for name, values in sink.latencies.items() if name not in (DOWN, SLOW) for v in values],
        "slow": sink.latencies.get(SLOW, []), "down": sink.latencies.get(DOWN, []), "problems": [],
    }
    if result["acknowledged"] != len(outbox):
        result["problems"].append(f"acknowledged prefix {result['acknowledged']} of {len(outbox)}")
    if bad:
        for name, record in ((SLOW, slow_record), (DOWN, down_record)):
            problem = check_order(record, outbox, name)
            if problem:
                result["problems"].append(problem)
    return result


def report(label: str, result: dict[str, Any]) -> None:
    good = result["good"]
    cpu = result["own_cpu"] + result["children_cpu"]
    print(f"{label:8}: {result['messages']:,} messages, healthy endpoints p50 {percentile(good, 0.5) * 1e3:.1f} ms "
          f"p99 {percentile(good, 0.99) * 1e3:.1f} ms max {max(good, default=0) * 1e3:.0f} ms; "
          f"CPU {cpu:.1f} s ({cpu / result['messages'] * 1e6:.0f} µs/message; this process "
          f"{result['own_cpu']:.1f} s), drained {result['wall'] - result['sent_for']:.1f} s after the last send")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long messages are sent")
    parser.add_argument("--rate", type=int, default=1000, help="messages a second, over all endpoints")
    parser.add_argument("--down-for", type=float, default=15.0, help="seconds the down endpoint refuses")
    parser.add_argument("--slow", type=float, default=2.0, help="seconds the slow endpoint takes to answer")
    parser.add_argument("--pairs", type=int, default=1, help="baseline and bad runs, alternating")
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    nginx = find_or_install_nginx()
    if nginx is None:
        print("webhooks: nginx unavailable, nothing to measure")
        return 1
    print(f"{ENDPOINTS} endpoints, {args.rate} msg/s for {args.seconds:g} s; bad run: {DOWN} answering 503 for "
          f"{args.down_for:g} s, {SLOW} answering in {args.slow:g} s", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a stopped run still stops its servers (finally)
    problems: list[str] = []
    ratios: list[float] = []
    own_cpu: dict[bool, list[float]] = {False: [], True: []}
    children_before = 0.0
    with tempfile.TemporaryDirectory(prefix="egress-webhooks-") as folder:
        for pair in range(args.pairs):
            results = {}
            # Alternate which run goes first, so a drift of the machine's load favours neither.
            for bad in (False, True) if pair % 2 == 0 else (True, False):
                work = Path(folder) / f"pair{pair}"
                work.mkdir(exist_ok=True)
                result = results[bad] = run(args, work, nginx, bad=bad)
                result["children_cpu"] = result["children_cpu_total"] - children_before
                children_before = result["children_cpu_total"]
                report("bad" if bad else "baseline", result)
                own_cpu[bad].append(result["own_cpu"] / result["messages"])
                problems += result["problems"]
            for name in (DOWN, SLOW):
                values = results[True]["down" if name == DOWN else "slow"]
                print(f"bad run, {name}: {len(values)} delivered (first deliveries in seq order per key), latency "
                      f"p50 {percentile(values, 0.5):.1f} s max {max(values, default=0):.1f} s")
            ratios.append(percentile(results[True]["good"], 0.99) / percentile(results[False]["good"], 0.99))
            print(f"pair {pair + 1}: healthy endpoints' p99, bad ÷ baseline {ratios[-1]:.2f}", flush=True)
    median = sorted(ratios)[len(ratios) // 2]
    print(f"healthy endpoints' p99, bad ÷ baseline: median {median:.2f} of {', '.join(f'{r:.2f}' for r in ratios)} "
          "(target <= 1.20)")
    if median > 1.2:
        problems.append(f"p99 ratio {median:.2f} > 1.20")
    for bad, values in own_cpu.items():
        print(f"{'bad' if bad else 'baseline'} runs: this process {sorted(values)[len(values) // 2] * 1e6:.0f} µs CPU "
              "per message (median)")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
