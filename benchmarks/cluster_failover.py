"""A stream leader's node lost on a 3-node NATS cluster whose nodes are ``rtt`` apart
(``benchmarks/cluster.py --failover-rtt-ms``): 0 messages may be lost.

Three nats-servers on loopback joined by routes, each node's route port behind a
:class:`~tests.delay_proxy.DelayProxy` (every route goes through the proxy of the node it dials:
``rtt / 2`` each way between any two nodes), each client port behind one too (the workers are as
far from the nodes). ``workers`` egress processes run ``benchmarks/cluster.py``'s Spec with
``--replicas 3`` on all three nodes until drained; ``egress receiver`` is the endpoint and holds
every request after a third of the messages (a positive signal that the run is mid-way, whatever
the machine's speed), then the node leading the pipeline's stream is SIGKILLed and the receiver
released. The workers carry on on the other two nodes (a quorum of the R3 stream) while a new
leader is elected. Reported: messages delivered (distinct idempotency keys) against the source's,
duplicates, and the seconds from the kill to the end of the run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nats
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.delay_proxy import DelayProxy  # noqa: E402
from tests.nats_server import NatsServer, free_port  # noqa: E402
from tests.waiting import eventually_sync  # noqa: E402

NODES = 3


@dataclass
class FailoverResult:
    messages: int
    delivered: int
    requests: int
    leader: str
    before_kill: int
    after_kill_seconds: float
    exit_codes: dict[str, int | None]
    failures: dict[str, str]
    """The last line of each worker that did not exit 0 (its log: ``PHASE/wI.log``)."""

    @property
    def lost(self) -> int:
        return self.messages - self.delivered

    def describe(self, rtt: float) -> str:
        return (f"failover rtt {rtt * 1e3:g} ms: 3 nodes (R3), stream leader {self.leader} SIGKILLed after "
                f"{self.before_kill:,} of {self.messages:,} deliveries; {self.delivered:,} delivered, "
                f"{self.lost:,} lost, {self.requests - self.delivered:,} duplicates, the run ended "
                f"{self.after_kill_seconds:.1f} s after the kill; worker exits {self.exit_codes}"
                + "".join(f"\n    {worker} failed: {line}" for worker, line in self.failures.items()))


class DelayedCluster:
    """Three JetStream nodes whose routes and client ports are each behind a delaying proxy."""

    def __init__(self, directory: Path, rtt: float) -> None:
        route_ports = [free_port() for _ in range(NODES)]
        self.route_proxies = [DelayProxy(port, rtt / 2) for port in route_ports]
        proxied = ",".join(f"nats://127.0.0.1:{proxy.start()}" for proxy in self.route_proxies)
        self.nodes = [NatsServer(directory / f"n{index}", name=f"n{index}",
                                 cluster_args=["--cluster_name", "egress-bench", "--cluster",
                                               f"nats://127.0.0.1:{port}", "--routes", proxied])
                      for index, port in enumerate(route_ports)]
        self.client_proxies = [DelayProxy(node.port, rtt / 2) for node in self.nodes]
        for proxy in self.client_proxies:
            proxy.start()

    def start(self) -> DelayedCluster:
        for node in self.nodes:  # all at once: a node is healthy only once the cluster has a meta leader
            node.start(wait=False)
        for node in self.nodes:
            node.wait_ready()
        return self

    @property
    def engine_url(self) -> str:
        return "nats://" + ",".join(f"127.0.0.1:{proxy.port}" for proxy in self.client_proxies)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        for proxy in [*self.client_proxies, *self.route_proxies]:
            proxy.stop()


def stream_leader(url: str, stream: str) -> str:
    """The name of the node leading ``stream`` (asked of the node at ``url``)."""
    async def ask() -> str:
        connection = await nats.connect(url)
        try:
            info = await connection.jetstream().stream_info(stream)
        finally:
            await connection.close()
        if info.cluster is None or info.cluster.leader is None:
            raise RuntimeError(f"stream {stream} has no leader")
        return info.cluster.leader

    return asyncio.run(ask())


def receiver_post(url: str, path: str) -> dict[str, int]:
    request = urllib.request.Request(url.rsplit("/", 1)[0] + path, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        found: dict[str, int] = json.load(answer)
        return found


def receiver_stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url.rsplit("/", 1)[0] + "/stats", timeout=30) as answer:
        found: dict[str, int] = json.load(answer)
        return found


def run_failover(receiver_url: str, spec: Path, phase: Path, count: int, workers: int, rtt: float,
                 timeout: float) -> FailoverResult:
    """See the module docs; ``spec`` is the phase's Spec posting to ``receiver_url`` (a fresh
    ``egress receiver``), ``count`` the messages of its source."""
    pipeline = yaml.safe_load(spec.read_text())["pipeline"]
    cluster = DelayedCluster(phase / "cluster", rtt).start()
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs = []
    try:
        receiver_post(receiver_url, f"/hold?after={count // 3}")
        for index in range(1, workers + 1):
            worker = f"w{index}"
            log = open(phase / f"{worker}.log", "wb")  # noqa: SIM115 - closed below, after the process ends
            logs.append(log)
            processes[worker] = subprocess.Popen(
                [sys.executable, "-m", "egress", "run", str(spec), "--engine", cluster.engine_url, "--replicas",
                 "3", "--worker-id", worker, "--state-dir", str(phase / f"state-{worker}"), "--until-drained",
                 "--quiet"], cwd=phase, stdout=log, stderr=subprocess.STDOUT)
        eventually_sync(lambda: receiver_stats(receiver_url).get("held", 0) > 0,
                        what="the receiver holding a request after a third of the messages", timeout=timeout)
        leader = stream_leader(cluster.nodes[0].url, f"KV_egress_{pipeline}")
        before = receiver_stats(receiver_url)["distinct_keys"]
        cluster.nodes[int(leader.removeprefix("n"))].kill()
        killed = time.monotonic()
        receiver_post(receiver_url, "/release")
        deadline = killed + timeout
        for process in processes.values():
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        ended = time.monotonic()
        stats = receiver_stats(receiver_url)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
        cluster.stop()
    codes = {name: process.returncode for name, process in processes.items()}
    failures = {name: last_line(phase / f"{name}.log") for name, code in codes.items() if code != 0}
    return FailoverResult(count, stats["distinct_keys"], stats["requests"], leader, before, ended - killed, codes,
                          failures)


def last_line(log: Path) -> str:
    """The last non-empty line of a worker's log (what it said before it exited), or ``(empty log)``."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "(empty log)"

