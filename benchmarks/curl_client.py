"""Instructions per request of egress's libcurl client alone (``egress.httpclient.curl``), against a
local nginx: no sink, no engine, no source, so a change to the client or to its libcurl options shows
in a count that the rest of egress does not blur.

What runs: ``--clients`` :class:`CurlClient` instances of ``--connections`` each on one event loop
(the async HTTP sink's default shape in ``benchmarks/delivery.py``: 4 partitions × 8), each keeping its
connections busy with POSTs of the delivery benchmark's flight payloads in the sink's request shape
(``prepared`` header lines with an ``Idempotency-Key``, ``Retry-After`` asked for, no local port),
handed over and collected in batches with ``submit_many`` and :class:`Completions` as the sink does.
Every request must come back 200 (the script exits 1 otherwise).

``--instructions N,M`` runs the requests in a child process under ``valgrind --tool=cachegrind
--cache-sim=no`` once with N and once with M requests, and prints the slope between them: the
instructions of one request (libcurl, pycurl, the client's Python and the event loop), start-up taken
out, which the machine's load does not move. ``--callgrind`` uses ``valgrind --tool=callgrind
--dump-instr=no`` instead, to attribute them per function (``--keep DIR`` keeps the output files, for
``callgrind_annotate --inclusive=yes``). Without ``--instructions`` it times ``--requests`` requests in
this process (CPU seconds of the process, wall time).

Run it from the repository root (figures: ``docs/benchmarks.md``)::

    python benchmarks/curl_client.py --instructions 20000,60000
    python benchmarks/curl_client.py --instructions 20000 --callgrind --keep /tmp/curl-client
    python benchmarks/curl_client.py --requests 100000
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from delivery import (  # the benchmark beside this one (a script's directory is on sys.path)
    IDEMPOTENCY_HEADER,
    NginxTarget,
    build_bodies,
    cachegrind_total,
    egress_keys,
    find_or_install_nginx,
    instruction_lines,
)
from egress.httpclient import CurlClient
from egress.httpclient.curl import Completions, Request, Response, post_header_lines

PAYLOADS = 1_000  # distinct bodies, cycled


async def run_requests(url: str, count: int, clients: int, connections: int) -> int:
    """POST ``count`` requests to ``url`` over ``clients`` clients of ``connections`` each; returns
    how many did not come back 200."""
    bodies = build_bodies(PAYLOADS)
    keys = egress_keys(count)
    headers = post_header_lines((), (IDEMPOTENCY_HEADER,))
    prefix = f"{IDEMPOTENCY_HEADER}: "
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    numbers = iter(range(count))
    failed = 0
    finished = 0

    def requests_for(how_many: int) -> list[tuple[Request, int]]:
        return [(Request(url, bodies[index % PAYLOADS], (prefix + keys[index], *headers), timeout=10.0,
                         capture_retry_after=True, prepared=True, capture_local_port=False), index)
                for index in itertools.islice(numbers, how_many)]

    def completed(client: CurlClient, batch: list[tuple[Any, Response]]) -> None:
        nonlocal failed, finished
        finished += len(batch)
        failed += sum(1 for _, response in batch if response.status != 200 or response.error is not None)
        more = requests_for(len(batch))
        if more:
            client.submit_many(more, completions[client])
        elif finished == count and not done.done():
            done.set_result(None)

    every = [CurlClient(max_connections=connections) for _ in range(clients)]
    completions = {client: Completions(loop, lambda batch, client=client: completed(client, batch),
                                       lambda _: False) for client in every}
    for client in every:
        client.submit_many(requests_for(connections), completions[client])
    await done
    for client in every:
        client.close()
    return failed


def child(url: str, count: int, clients: int, connections: int) -> int:
    failed = asyncio.run(run_requests(url, count, clients, connections))
    if failed:
        print(f"{failed:,} of {count:,} requests did not come back 200", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000, help="requests of a timed run (default 100,000)")
    parser.add_argument("--clients", type=int, default=4, help="clients on the loop (default 4: the partitions)")
    parser.add_argument("--connections", type=int, default=8, help="connections per client (default 8)")
    parser.add_argument("--instructions", default=None, metavar="N,M",
                        help="one child run of each count under valgrind, and the per-request slope")
    parser.add_argument("--callgrind", action="store_true", help="with --instructions: callgrind, not cachegrind")
    parser.add_argument("--keep", type=Path, help="keep nginx's files and valgrind's output here")
    parser.add_argument("--child", default=None, metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return child(args.child, args.requests, args.clients, args.connections)
    counts = [int(n) for n in args.instructions.split(",") if n.strip()] if args.instructions else []
    if args.callgrind and not counts:
        parser.error("--callgrind needs --instructions N,M")
    nginx = find_or_install_nginx()
    if nginx is None:
        print("curl_client: nginx unavailable, nothing to measure")
        return 1
    tool = ["valgrind", "--tool=callgrind", "--dump-instr=no"] if args.callgrind else \
        ["valgrind", "--tool=cachegrind", "--cache-sim=no"]
    with tempfile.TemporaryDirectory(prefix="egress-curl-client-") as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        target = NginxTarget(nginx, work)
        totals: list[int] = []
        try:
            for index, count in enumerate(counts or [args.requests]):
                target.start()
                load = os.getloadavg()[0]
                command = [sys.executable, __file__, "--child", target.url, "--requests", str(count),
                           "--clients", str(args.clients), "--connections", str(args.connections)]
                out = work / f"{tool[1][7:]}-{index}.out"
                if counts:
                    command = [*tool, f"--{tool[1][7:]}-out-file={out}", *command]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                started = time.perf_counter()
                done = subprocess.run(command, check=False)
                seconds = time.perf_counter() - started
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                stats = target.finish()
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                print(f"{count:,} requests, {args.clients} clients × {args.connections} connections: "
                      f"{seconds:.2f} s, CPU {cpu:.2f} s = {cpu / count * 1e6:.1f} µs/request "
                      f"(user {after.ru_utime - before.ru_utime:.2f} s, system "
                      f"{after.ru_stime - before.ru_stime:.2f} s); nginx got {stats['requests']:,}; "
                      f"load average {load:.2f}", flush=True)
                if done.returncode != 0 or stats["distinct_keys"] != count:
                    print(f"FAILED: the child exited {done.returncode}, {stats['distinct_keys']:,} keys answered 200")
                    return 1
                if counts:
                    totals.append(cachegrind_total(out))
        finally:
            target.stop()
    if counts:
        print(f"instructions ({' '.join(tool[1:])}, the whole child process):")
        for line in instruction_lines(counts, totals):
            print(line.replace("egress run of", "a run of").replace("messages", "requests")
                  .replace("per message", "per request"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
