"""Cluster throughput and cost (issues 11 and 24): the delivery of ``benchmarks/delivery.py``
(300,000 messages by default: the data set has 336,776 flights), in one run, embedded (SQLite)
and on NATS JetStream with 1, 2 and 4 workers. Each process pays about a CPU second whatever the
messages (the interpreter and its imports, joining, leaving): at 100,000 messages that was a
quarter of nats-4's CPU, so the default run is long enough for the steady state to dominate, and
the fixed part is measured apart (``--fixed-messages``).

Everything but the engine is ``benchmarks/delivery.py``'s egress phase, through its own helpers: the
same flight payloads (``build_bodies``), the same JSONL source, identity process function and Spec
(``run_egress`` writes them for the embedded phase; the NATS phases reuse that Spec with the
endpoint's new URL), the async HTTP sink with its default parameters, ``partition_count`` 4. The
endpoint (``--target``) is nginx answering 200 to every POST by default (``NginxTarget``: one
nginx worker, keys with a 2xx counted from its access log), or ``egress receiver``
(``ReceiverTarget``, Python: it takes a core of its own on a machine of two), restarted before
each phase so its count is that phase's alone.

* ``embedded``: ``egress run SPEC --until-drained`` (``run_egress``), one process.
* ``nats-N``: a fresh ``nats-server -js`` (from the venv, loopback, a temporary store) and N
  processes ``egress run SPEC --engine nats://… --worker-id wI --until-drained``, started together;
  timed from the first spawn to the last exit (every worker ends once the pipeline is drained).

* ``http-N`` (``benchmarks/cluster_ingest.py``): N workers whose ``http`` source has N readers
  behind nginx (``tests/nginx.py``'s balancer), ``--http-events`` events POSTed by
  ``benchmarks/ingest.py``'s 64 clients in a process of their own; in two forms, ``ingest`` (the
  events dropped) and ``relay`` (delivered to the endpoint), each worker's CPU per event it
  accepted, over the clients' window; issue 24's target: <= 100 µs per worker in the ingest form.

For each delivery phase: messages delivered (distinct idempotency keys at the endpoint; every phase must
deliver all, or the script exits 1), msg/s, and CPU µs per message counting every egress process
(``os.wait4``'s rusage: all threads) plus the nats-server (``/proc/<pid>/stat`` before and after),
with the breakdown per process, and what the server handled per 1,000 messages (``/varz``,
``/jsz``). The machine may have fewer cores than processes: for each NATS phase the script also
prints the rate the CPU cost alone would allow with one core per process (messages ÷ the busiest
process's CPU seconds). Targets: issue 11's (NATS 1 worker >= 0.5 × embedded's msg/s; 2 workers
>= 1.3 × 1 worker's) and issue 24's: each NATS phase's CPU per message <= 1.25 × embedded's; with
one core per process nats-2 >= 1.8 × nats-1 and nats-4 >= 3.2 × nats-1 (these need a source read
by several readers: one reader is one process's work whatever the workers). Each process also
pays a fixed CPU cost whatever the messages (interpreter and imports, joining, the hand-over when
another worker joins, leaving): each NATS phase is run again on ``--fixed-messages`` messages, and
the script prints each process's CPU per message without that fixed part and the rate it allows
with one core per process, which is what more cores give on a long run; the embedded phase is run
on them too, and the targets are printed again on those steady-state figures (each process's fixed
CPU taken off), apart from the targets at the run's size.

    python benchmarks/cluster.py                          # embedded, nats-1, -2, -4 (+ fixed costs), http-1, -2
    python benchmarks/cluster.py --phases http-1,http-2 --http-events 20000   # the http ingest alone
    python benchmarks/cluster.py --messages 20000 --phases embedded,nats-1 --target receiver
    python benchmarks/cluster.py --messages 30000 --profile   # + each worker under py-spy --gil
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from tests.delay_proxy import DelayProxy  # noqa: E402
from tests.nats_server import NatsServer  # noqa: E402

from cluster_counters import process_cpu, races_lost, server_counters, traffic_note  # noqa: E402
from cluster_failover import FailoverResult, run_failover  # noqa: E402
from cluster_ingest import IngestResult, run_http_phase  # noqa: E402
from cluster_latency import describe_latency, run_latency  # noqa: E402
from delivery import (  # noqa: E402
    PROFILE_RATE,
    NginxTarget,
    ReceiverTarget,
    Target,
    build_bodies,
    find_or_install_nginx,
    profile_summary,
    run_egress,
    stop_process,
)
from nats_tally import Tally  # noqa: E402

TARGETS = (("nats-1", "embedded", 0.5), ("nats-2", "nats-1", 1.3))
"""(phase, the phase it is compared with, lowest ratio of their msg/s): issue 11's targets."""
CORE_TARGETS = (("nats-2", "nats-1", 1.8), ("nats-4", "nats-1", 3.2))
"""(phase, the phase it is compared with, lowest ratio of their rates with one core per process):
issue 24's scaling targets."""
COST_TARGET = 1.25
"""Issue 24: a NATS phase's CPU per message (every process) at most this many times embedded's."""
PHASES = ("embedded", "nats-1", "nats-2", "nats-4")
HTTP_PHASES = ("http-1", "http-2", "http-4")
"""N workers ingesting webhook events through nginx (``benchmarks/cluster_ingest.py``)."""
DEFAULT_PHASES = (*PHASES, "http-1", "http-2")
SOURCE_FILES = 16
"""Files the NATS phases' source is dealt into with ``--source-readers workers`` (several per reader:
the files source's reader 0 deals them, the same count to each reader of 1, 2 or 4)."""
PREREGISTERED_TTL = 600.0
"""Seconds a member pre-registered for ``--instructions`` stays listed unless its worker registers
(replacing it) or leaves first: longer than any worker's start under valgrind."""
POLL = 0.05  # seconds between two checks for exited workers


@dataclass
class ClusterResult:
    """One phase: what arrived, how long it took and the CPU seconds of each process."""

    name: str
    messages: int
    seconds: float
    delivered: int = 0
    requests: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # process name → CPU seconds (user + system)
    notes: list[str] = field(default_factory=list)
    load: float = 0.0

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_message(self) -> float:
        """CPU µs per message, every process of the phase together."""
        return 1e6 * sum(self.cpu.values()) / self.messages if self.messages else 0.0

    @property
    def complete(self) -> bool:
        return self.delivered == self.messages

    def breakdown(self) -> str:
        return ", ".join(f"{name} {1e6 * seconds / self.messages:,.0f}" for name, seconds in self.cpu.items())

    def core_bound_rate(self) -> float:
        """Messages ÷ the busiest process's CPU seconds: the rate with one core per process."""
        busiest = max(self.cpu.values(), default=0.0)
        return self.messages / busiest if busiest > 0 else 0.0


def run_embedded(target: Target, bodies: Sequence[bytes], count: int, partitions: int, work: Path,
                 timeout: float) -> ClusterResult:
    """``benchmarks/delivery.py``'s egress phase as it is (one embedded process)."""
    load = os.getloadavg()[0]
    phase = run_egress(target, bodies, count, partitions, None, work, timeout, name="embedded")
    result = ClusterResult("embedded", count, phase.seconds, phase.delivered, phase.stats.get("requests", 0),
                           {"egress": phase.cpu_seconds}, phase.notes, load)
    return result


def nats_spec(work: Path, phase: Path, url: str, first: int | None = None, readers: int = 0,
              files: int = SOURCE_FILES) -> Path:
    """The embedded phase's Spec (written by ``run_egress``) with the receiver's current ``url``;
    with ``first``, reading a copy of its source's first ``first`` records only; with ``readers``,
    its records dealt round-robin into ``files`` files, read as a followed glob by ``readers``
    readers (the files source shares a glob's files among its readers: one reader's records pass
    through one process whatever the workers)."""
    spec = yaml.safe_load((work / "embedded" / "spec.yaml").read_text())
    spec["computations"]["deliver"]["sinks"]["http"]["parameters"]["url"] = url
    parameters = spec["sources"]["payloads"]["parameters"]
    if first is not None:
        with open(parameters["path"], "rb") as source:
            records = [line for _, line in zip(range(first), source, strict=False)]
        parameters["path"] = str(phase / "payloads.jsonl")
        (phase / "payloads.jsonl").write_bytes(b"".join(records))
    if readers:
        folder = phase / "source"
        folder.mkdir()
        outs = [open(folder / f"part-{number:02d}.jsonl", "wb") for number in range(files)]  # noqa: SIM115
        with open(parameters["path"], "rb") as source:
            for number, line in enumerate(source):
                outs[number % files].write(line)
        for out in outs:
            out.close()
        spec["sources"]["payloads"]["parameters"] = {"path": str(folder / "*.jsonl"), "follow": True,
                                                     "readers": readers}
    path = phase / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.copy(work / "embedded" / "functions.py", phase / "functions.py")
    return path


def preregister(url: str, spec: Path, workers: int) -> None:
    """List members ``w1`` .. ``w<workers>`` of ``spec``'s pipeline on the NATS server at ``url``
    for :data:`PREREGISTERED_TTL` seconds, as each worker's own registration will (same Spec
    digest, so none refuses another): the first worker up then takes only its share of the units
    and leaves the others' to them, whatever the order and the delay of their starts (under
    valgrind a start takes seconds and one worker may join once the others read every file; the
    real run's workers join within ms of each other). A worker's registration replaces its entry,
    its leaving deletes it."""
    from egress.engines import MemberInfo
    from egress.engines.nats import NatsEngine
    from egress.runtime.cluster.worker import spec_digest
    from egress.spec.models import load_spec

    loaded = load_spec(spec)  # the Spec as a worker loads it (its digest), without importing its functions

    async def register() -> None:
        engine = NatsEngine(url, loaded.pipeline)
        await engine.open()
        try:
            for index in range(1, workers + 1):
                await engine.register(MemberInfo(f"w{index}", spec_digest(loaded), {"preregistered": True}),
                                      PREREGISTERED_TTL)
        finally:
            await engine.close()

    asyncio.run(register())


def run_workers(target: Target, count: int, workers: int, work: Path, timeout: float,
                profile: bool = False, first: int | None = None, rtt: float | None = None,
                partitioned: bool = False, instructions: bool = False, tally: bool = False,
                preregistered: bool = False) -> ClusterResult:
    """A fresh nats-server and ``workers`` egress processes on one pipeline until it is drained; with
    ``profile``, each worker under ``py-spy record --gil --threads -f raw`` (the thread holding the
    GIL: py-spy takes a thread waiting in epoll or on a queue for a running one on this machine),
    its samples summed up in the result's notes; with ``first``, on the source's
    first ``first`` records (``count``) only; with ``rtt`` (seconds), the workers reach the server
    through a :class:`~tests.delay_proxy.DelayProxy` adding ``rtt / 2`` each way (the round trip
    measured through it is in the notes); with ``partitioned``, the source is read by as many
    readers as there are workers (:func:`nats_spec`); with ``instructions``, each worker under
    ``valgrind --tool=cachegrind --cache-sim=no``, its instructions in the notes (a count the
    machine's load and its number of cores cannot move, unlike CPU seconds), every worker
    pre-registered (:func:`preregister`) so that each runs its share from its start (also with
    ``preregistered``); with ``tally``, every message the server routes counted by kind
    (``benchmarks/nats_tally.py``)."""
    name = f"nats-{workers}" + ("" if first is None else "-fixed") + ("" if rtt is None else f"-rtt{rtt * 1e3:g}ms")
    phase = work / name
    shutil.rmtree(phase, ignore_errors=True)
    phase.mkdir(parents=True)
    spec = nats_spec(work, phase, target.url, first, workers if partitioned else 0)
    server = NatsServer(phase / "nats").start()
    assert server.pid is not None
    proxy = None if rtt is None else DelayProxy(server.port, rtt / 2)
    engine_url = server.url
    notes: list[str] = []
    if proxy is not None:
        proxy.start()
        engine_url = proxy.url
        notes.append(f"through a delaying proxy: {rtt * 1e3:g} ms asked, round trip measured "
                     f"{measured_rtt(engine_url) * 1e3:.2f} ms (median of 20 NATS PINGs)")
    load = os.getloadavg()[0]
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs = []
    try:
        if instructions or preregistered:
            preregister(server.url, spec, workers)
        counting = Tally(server.url) if tally else None
        if counting is not None:
            counting.start()
        server_cpu = process_cpu(server.pid)
        traffic = server_counters(server)
        started = time.perf_counter()
        for index in range(1, workers + 1):
            worker = f"w{index}"
            log = open(phase / f"{worker}.log", "wb")  # noqa: SIM115 - closed below, after the process ends
            logs.append(log)
            command = [sys.executable, "-m", "egress", "run", str(spec), "--engine", engine_url, "--worker-id",
                       worker, "--state-dir", str(phase / f"state-{worker}"), "--until-drained", "--quiet",
                       "--report", str(phase / f"report-{worker}.json")]
            if profile:
                py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                command = [py_spy, "record", "--gil", "--threads", "--full-filenames", "-f", "raw",
                           "-r", str(PROFILE_RATE), "-o", str(phase / f"profile-{worker}.txt"), "--", *command]
            elif instructions:
                command = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                           f"--cachegrind-out-file={phase / f'cachegrind-{worker}.out'}", *command]
            processes[worker] = subprocess.Popen(command, cwd=phase, stdout=log, stderr=subprocess.STDOUT)
        cpu = wait_all(processes, timeout)
        seconds = time.perf_counter() - started
        cpu["nats-server"] = process_cpu(server.pid) - server_cpu
        traffic_after = server_counters(server)
        if counting is not None:
            kinds = counting.stop()
            notes.append("messages routed by kind (benchmarks/nats_tally.py), per 1,000 messages and per second per "
                         "worker: " + "; ".join(f"{kind} {routed * 1e3 / count:.1f} / "
                                                f"{routed / seconds / workers:.2f}"
                                                for kind, routed in kinds.most_common()))
    finally:
        for process in processes.values():
            if process.poll() is None:
                stop_process(process)
        for log in logs:
            log.close()
        if proxy is not None:
            proxy.stop()
        server.stop()
    stats = target.finish()
    result = ClusterResult(name, count, seconds, stats["distinct_keys"], stats["requests"], cpu,
                           [*notes, traffic_note(traffic, traffic_after, count)], load)
    for worker, process in processes.items():
        if process.returncode != 0:
            tail = (phase / f"{worker}.log").read_text(errors="replace").strip()[-1500:]
            result.notes.append(f"{worker} exited {process.returncode}: {tail}")
        report_path = phase / f"report-{worker}.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        result.notes.append(f"{worker}: {report.get('posts', 0):,} POSTs, {report.get('epochs', 0):,} epochs, "
                            f"{report.get('rows_read', 0):,} rows read, "
                            f"{races_lost(phase / f'{worker}.log'):,} log-append races lost")
        if instructions and (phase / f"cachegrind-{worker}.out").exists():
            result.notes.append(instructions_note(worker, phase / f"cachegrind-{worker}.out", count))
        if profile and (phase / f"profile-{worker}.txt").exists():
            result.notes += profile_notes(worker, phase / f"profile-{worker}.txt", count)
    return result


def measured_rtt(url: str) -> float:
    """The median of 20 round trips (a NATS PING answered by a PONG) to the server at ``url``, seconds."""
    import nats  # only the latency phases need it

    async def ping() -> float:
        connection = await nats.connect(url)
        try:
            times = []
            for _ in range(20):
                started = time.perf_counter()
                await connection.flush()
                times.append(time.perf_counter() - started)
            return statistics.median(times)
        finally:
            await connection.close()

    return asyncio.run(ping())


def instructions_note(worker: str, out: Path, count: int) -> str:
    """A worker's instructions (cachegrind's ``summary:`` line), in all and per message of the phase."""
    total = next(int(line.split()[1]) for line in out.read_text().splitlines() if line.startswith("summary:"))
    return f"{worker} instructions (cachegrind): {total / 1e6:,.0f} M, {total / count / 1e3:,.1f} K per message"


def profile_notes(worker: str, raw: Path, count: int) -> list[str]:
    """A worker's py-spy samples as µs per message of the phase: by module, function and thread."""
    found = profile_summary(raw)
    per_message = 1e6 / PROFILE_RATE / max(count, 1)
    lines = [f"{worker} py-spy (--gil, {PROFILE_RATE} Hz): {found.total * per_message:.1f} µs/msg"]
    lines += [f"  module   {name:<50} {samples * per_message:6.1f}" for name, samples in found.modules[:12]]
    lines += [f"  function {name:<50} {samples * per_message:6.1f}" for name, samples in found.functions]
    lines += [f"  thread   {name:<50} {samples * per_message:6.1f}" for name, samples in found.threads]
    return lines


def wait_all(processes: dict[str, subprocess.Popen[bytes]], timeout: float) -> dict[str, float]:
    """Reap every process (``os.wait4``: its CPU seconds, all threads); raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    cpu: dict[str, float] = {}
    while len(cpu) < len(processes):
        for name, process in processes.items():
            if name in cpu:
                continue
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid == process.pid:
                process.returncode = os.waitstatus_to_exitcode(status)
                cpu[name] = usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers did not finish within {timeout:.0f} s")
        if len(cpu) < len(processes):
            time.sleep(POLL)
    return cpu


def fixed_cost(result: ClusterResult, fixed: ClusterResult) -> list[str]:
    """Each process's CPU split into a fixed part (its CPU in ``fixed``, the same phase on a few
    messages: start-up, joining, the hand-over when the second worker joins, leaving) and a part
    per message (the rest, over the other messages), and the rate that per-message CPU allows with
    one core per process: what more cores give once a run is long enough to amortise the fixed part."""
    if result.messages <= fixed.messages:
        return []
    variable = variable_cpu(result, fixed)
    busiest = max(variable.values(), default=0.0)
    return [f"          fixed CPU (the phase on {fixed.messages:,} messages): "
            + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in fixed.cpu.items()),
            "          per message without it: "
            + ", ".join(f"{name} {1e6 * v:,.0f} µs" for name, v in variable.items())
            + f" (all {1e6 * sum(variable.values()):,.0f}); one core per process: "
            f"{1 / busiest if busiest else 0:,.0f} msg/s"]


def variable_cpu(result: ClusterResult, fixed: ClusterResult) -> dict[str, float]:
    """Each process's CPU seconds per message without its fixed part (:func:`fixed_cost`)."""
    extra = result.messages - fixed.messages
    return {name: max(0.0, seconds - fixed.cpu.get(name, 0.0)) / extra for name, seconds in result.cpu.items()}


def steady_verdicts(results: dict[str, ClusterResult], fixed_results: dict[str, ClusterResult]) -> list[str]:
    """Issue 24's targets once each process's fixed CPU is taken off (start-up, joining, leaving:
    each phase again on ``--fixed-messages``, embedded too): what a long run tends to. Printed
    apart from :func:`verdicts`, which count everything at this run's size."""
    summary: list[str] = []
    embedded, embedded_fixed = results.get("embedded"), fixed_results.get("embedded")
    if embedded is None or embedded_fixed is None or embedded.messages <= embedded_fixed.messages:
        return summary
    floor = sum(variable_cpu(embedded, embedded_fixed).values())
    print(f"  steady state (each process's fixed CPU taken off; embedded {1e6 * floor:,.0f} µs/msg, its fixed "
          f"part {embedded_fixed.cpu['egress']:.2f} s):")
    rates: dict[str, float] = {}
    for name, result in results.items():
        if name == "embedded" or name not in PHASES or name not in fixed_results or floor <= 0:
            continue
        variable = variable_cpu(result, fixed_results[name])
        ratio = sum(variable.values()) / floor
        busiest = max(variable.values(), default=0.0)
        rates[name] = 1 / busiest if busiest else 0.0
        mark = "PASS" if ratio <= COST_TARGET else "MISS"
        print(f"    CPU per message {name} / embedded: {ratio:.2f}   target <= {COST_TARGET:g}   {mark}")
        summary.append(f"steady cost {name}/embedded {ratio:.2f} (<= {COST_TARGET:g} {mark})")
    for phase, other, bound in CORE_TARGETS:
        if phase in rates and rates.get(other, 0.0) > 0:
            ratio = rates[phase] / rates[other]
            mark = "PASS" if ratio >= bound else "MISS"
            print(f"    one core per process {phase} / {other}: {ratio:.2f}   target >= {bound:g}   {mark}")
            summary.append(f"steady cores {phase}/{other} {ratio:.2f} (>= {bound:g} {mark})")
    return summary


def describe(result: ClusterResult) -> list[str]:
    check = "OK" if result.complete else f"LOST {result.messages - result.delivered:,}"
    lines = [f"{result.name:<9} {result.rate:>8,.0f} msg/s  {result.seconds:7.2f} s  "
             f"CPU {result.cpu_per_message:6,.0f} µs/msg ({result.breakdown()})  "
             f"delivered {result.delivered:,}/{result.messages:,} ({check}), {result.requests:,} requests, "
             f"load average {result.load:.2f} at its start"]
    if len(result.cpu) > 1:
        lines.append(f"          one core per process: {result.core_bound_rate():,.0f} msg/s (messages ÷ the busiest "
                     "process's CPU seconds)")
    return lines


def verdicts(results: dict[str, ClusterResult]) -> list[str]:
    """Issue 24's targets, printed: each NATS phase's CPU per message against embedded's, and the
    rates with one core per process against nats-1's."""
    summary: list[str] = []
    embedded = results.get("embedded")
    for name, result in results.items():
        if name in PHASES and name != "embedded" and embedded is not None and embedded.cpu_per_message > 0:
            ratio = result.cpu_per_message / embedded.cpu_per_message
            mark = "PASS" if ratio <= COST_TARGET else "MISS"
            print(f"  CPU per message {name} / embedded: {ratio:.2f}   target <= {COST_TARGET:g}   {mark}")
            summary.append(f"cost {name}/embedded {ratio:.2f} (<= {COST_TARGET:g} {mark})")
    for phase, other, bound in CORE_TARGETS:
        if phase in results and other in results and results[other].core_bound_rate() > 0:
            ratio = results[phase].core_bound_rate() / results[other].core_bound_rate()
            mark = "PASS" if ratio >= bound else "MISS"
            print(f"  one core per process {phase} / {other}: {ratio:.2f}   target >= {bound:g}   {mark}")
            summary.append(f"cores {phase}/{other} {ratio:.2f} (>= {bound:g} {mark})")
    return summary


def rtt_verdict(results: dict[float, ClusterResult], latencies: dict[float, list[float]],
                partitions: int) -> list[str]:
    """The --rtt-ms phases side by side, and issue 24's target: the rate at the largest round trip
    at least half the rate at the smallest."""
    summary: list[str] = []
    for rtt, result in sorted(results.items()):
        line = (f"rtt {rtt * 1e3:g} ms: {result.rate:,.0f} msg/s, {result.rate / partitions:,.0f} per partition, "
                f"CPU {result.cpu_per_message:,.0f} µs/msg")
        if rtt in latencies:
            line += "; " + describe_latency(rtt, latencies[rtt]).split(": ", 1)[1]
        print("  " + line)
        summary.append(f"rtt {rtt * 1e3:g} ms {result.rate:,.0f} msg/s")
    if len(results) > 1:
        low, high = results[min(results)], results[max(results)]
        ratio = high.rate / low.rate if low.rate else 0.0
        mark = "PASS" if ratio >= 0.5 else "MISS"
        print(f"  rate at rtt {max(results) * 1e3:g} ms / at {min(results) * 1e3:g} ms: {ratio:.2f}   target >= 0.5   "
              f"{mark}")
        summary.append(f"rtt {max(results) * 1e3:g}/{min(results) * 1e3:g} {ratio:.2f} (>= 0.5 {mark})")
    return summary


def run_failover_phase(work: Path, args: argparse.Namespace, partitioned: bool) -> FailoverResult:
    """:func:`~cluster_failover.run_failover` of ``--failover-rtt-ms`` with ``--rtt-workers`` workers,
    to an ``egress receiver`` of its own (it holds requests: nginx cannot)."""
    phase = work / f"failover-rtt{args.failover_rtt_ms:g}ms"
    shutil.rmtree(phase, ignore_errors=True)
    phase.mkdir(parents=True)
    receiver = ReceiverTarget()
    receiver.start()
    try:
        workers = max(2, args.rtt_workers)
        spec = nats_spec(work, phase, receiver.url, None, workers if partitioned else 0)
        return run_failover(receiver.url, spec, phase, args.messages, workers, args.failover_rtt_ms / 1e3,
                            args.timeout)
    finally:
        receiver.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=300_000, help="messages per phase (default 300,000)")
    parser.add_argument("--partitions", type=int, default=4, help="partition_count of the Spec (default 4)")
    parser.add_argument("--phases", default=",".join(DEFAULT_PHASES),
                        help=f"comma-separated subset of {','.join(PHASES + HTTP_PHASES)} (embedded runs first "
                             f"when a nats phase is asked: its Spec is theirs); default {','.join(DEFAULT_PHASES)}")
    parser.add_argument("--http-events", type=int, default=20_000,
                        help="events POSTed per http-N phase and form (default 20,000)")
    parser.add_argument("--http-forms", default="ingest,relay",
                        help="the http-N phases' forms: ingest (events dropped), relay (delivered); default both")
    parser.add_argument("--http-keyed", action="store_true",
                        help="the http-N phases' clients send each event under an Idempotency-Key")
    parser.add_argument("--target", choices=("nginx", "receiver"), default="nginx",
                        help="the endpoint: nginx answering 200 to every POST, keys counted from its access log "
                             "(default; one worker process, far from being the bottleneck), or egress receiver "
                             "(Python: it takes a core of its own)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per phase (default 900)")
    parser.add_argument("--fixed-messages", type=int, default=300,
                        help="after the NATS phases, run each again on this many messages to measure each "
                             "process's fixed CPU (start-up, joining, hand-over, leaving) and print the CPU per "
                             "message without it (default 300; 0: skip)")
    parser.add_argument("--profile", action="store_true",
                        help="run each NATS worker under py-spy (slower) and print where its CPU goes")
    parser.add_argument("--instructions", action="store_true",
                        help="run each NATS worker under valgrind's cachegrind (far slower) and print its "
                             "instructions per message: what it costs whatever the load and the cores; each http-N "
                             "worker under callgrind, counting over the clients' window only (per event)")
    parser.add_argument("--preregister", action="store_true",
                        help="list every worker as a member before starting them (as --instructions does), so that "
                             "each reads and delivers its share from its start, as workers that join within ms of "
                             "each other do; without it the workers' start-ups share this machine's cores, the first "
                             "joins up to a second before the last and runs the others' units until they join")
    parser.add_argument("--tally", action="store_true",
                        help="count every message the NATS server routes by kind (a subscription to '>': it "
                             "adds to the server's CPU), per 1,000 messages and per second per worker")
    parser.add_argument("--source-readers", choices=("workers", "one"), default="workers",
                        help=f"the NATS phases' source: dealt into {SOURCE_FILES} files read as a followed glob by "
                             "as many readers as workers (default), or the embedded phase's one file and reader")
    parser.add_argument("--rtt-ms", default="",
                        help="comma-separated round trips in ms (e.g. 0,1,5): after the other phases, for each, "
                             "nats-1 again with the workers reaching the server through a delaying proxy "
                             "(rate per partition), and the end-to-end latency of events sent one at a time "
                             "(benchmarks/cluster_latency.py); target: the rate at the largest >= half the "
                             "rate at the smallest")
    parser.add_argument("--failover-rtt-ms", type=float, default=None,
                        help="then a 3-node NATS cluster (R3) with this round trip between nodes and to the "
                             "workers, the stream leader's node SIGKILLed mid-run (benchmarks/cluster_failover.py); "
                             "target: 0 lost")
    parser.add_argument("--rtt-workers", type=int, default=1, help="workers of the --rtt-ms phases (default 1)")
    parser.add_argument("--latency-events", type=int, default=100,
                        help="events per latency measurement of --rtt-ms (default 100)")
    parser.add_argument("--keep", type=Path, help="keep the Specs, states, logs and reports here")
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    partitioned = args.source_readers == "workers"
    unknown = set(phases) - set(PHASES) - set(HTTP_PHASES)
    if unknown:
        parser.error(f"--phases: unknown {', '.join(sorted(unknown))}")
    began = time.time()
    nats_phases = [p for p in phases if p in PHASES and p != "embedded"]
    flights = ["embedded", *nats_phases] if nats_phases or "embedded" in phases else []
    bodies = build_bodies(args.messages) if flights else []
    if flights:
        print(f"{args.messages:,} flight payloads ({sum(map(len, bodies)) / len(bodies):.0f} bytes on average), "
              f"partition_count {args.partitions}, default sink parameters, to {args.target}; load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, ClusterResult] = {}
    http_results: list[IngestResult] = []
    fixed_results: dict[str, ClusterResult] = {}
    rtt_results: dict[float, ClusterResult] = {}
    latencies: dict[float, list[float]] = {}
    failed: str | None = None
    failover: FailoverResult | None = None
    with tempfile.TemporaryDirectory(prefix="egress-cluster-bench-") as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        target: Target = ReceiverTarget()
        if args.target == "nginx":
            binary = find_or_install_nginx()
            if binary is None:
                parser.error("--target nginx: no nginx binary (install nginx-light, or use --target receiver)")
            target = NginxTarget(binary, work)
        try:
            for phase in flights:
                target.start()
                print(f"{phase}: POSTing to {target.url} ...", flush=True)
                if phase == "embedded":
                    result = run_embedded(target, bodies, args.messages, args.partitions, work, args.timeout)
                else:
                    result = run_workers(target, args.messages, int(phase.split("-")[1]), work, args.timeout,
                                         args.profile, partitioned=partitioned, instructions=args.instructions,
                                         tally=args.tally, preregistered=args.preregister)
                results[phase] = result
                for line in describe(result):
                    print("  " + line, flush=True)
                for note in result.notes:
                    print(f"    {note}", flush=True)
            for phase in [p for p in results if p != "embedded" and 0 < args.fixed_messages < args.messages]:
                target.start()
                fixed = run_workers(target, args.fixed_messages, int(phase.split("-")[1]), work, args.timeout,
                                    first=args.fixed_messages, partitioned=partitioned, instructions=args.instructions,
                                    preregistered=args.preregister)
                for note in fixed.notes if args.instructions else []:
                    print(f"    {note}", flush=True)
                fixed_results[phase] = fixed
                print(f"{fixed.name}: {fixed.delivered:,}/{fixed.messages:,} delivered, load average {fixed.load:.2f}")
                for line in fixed_cost(results[phase], fixed):
                    print("  " + line, flush=True)
            if fixed_results:
                target.start()
                floor = run_egress(target, bodies, args.fixed_messages, args.partitions, None, work, args.timeout,
                                   name="embedded-fixed")
                fixed_results["embedded"] = ClusterResult("embedded-fixed", args.fixed_messages, floor.seconds,
                                                          floor.delivered, floor.stats.get("requests", 0),
                                                          {"egress": floor.cpu_seconds})
                print(f"embedded-fixed: {floor.delivered:,}/{args.fixed_messages:,} delivered, fixed CPU "
                      f"{floor.cpu_seconds:.2f} s", flush=True)
            for phase in (p for p in phases if p in HTTP_PHASES):
                for form in (f.strip() for f in args.http_forms.split(",") if f.strip()):
                    target.start()
                    http = run_http_phase(work, target.url, lambda: target.finish()["distinct_keys"],
                                          int(phase.split("-")[1]), args.http_events, form == "relay",
                                          args.timeout, args.http_keyed, PROFILE_RATE if args.profile else 0,
                                          args.instructions)
                    http_results.append(http)
                    for line in http.describe():
                        print("  " + line, flush=True)
                    for worker, raw in http.profiles.items():
                        for note in profile_notes(worker, raw, int(http.accepted[worker])):
                            print(f"    {note}", flush=True)
            rtts = [float(value) / 1e3 for value in args.rtt_ms.split(",") if value.strip()]
            for rtt in rtts:
                target.start()
                result = run_workers(target, args.messages, args.rtt_workers, work, args.timeout, rtt=rtt,
                                     partitioned=partitioned)
                results[result.name] = result
                rtt_results[rtt] = result
                for line in describe(result):
                    print("  " + line, flush=True)
                for note in result.notes:
                    print(f"    {note}", flush=True)
                latencies[rtt] = run_latency(work, rtt, args.latency_events)
                print("  " + describe_latency(rtt, latencies[rtt]), flush=True)
            if args.failover_rtt_ms is not None:
                failover = run_failover_phase(work, args, partitioned)
                print("  " + failover.describe(args.failover_rtt_ms / 1e3), flush=True)
        except RuntimeError as error:
            failed = str(error)
        finally:
            target.stop()
    print()
    print(f"cluster benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))}, "
          f"{time.time() - began:,.0f} s, {os.cpu_count()} cores, load average now "
          f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, result in results.items():
        for line in describe(result):
            print("  " + line)
        if name in fixed_results:
            for line in fixed_cost(result, fixed_results[name]):
                print("  " + line)
    summary = [f"{name} {result.rate:,.0f} msg/s {result.cpu_per_message:,.0f} µs/msg"
               for name, result in results.items()]
    for phase, other, bound in TARGETS:
        if phase in results and other in results and results[other].rate > 0:
            ratio = results[phase].rate / results[other].rate
            mark = "PASS" if ratio >= bound else "MISS"
            print(f"  {phase} / {other}: {ratio:.2f}   target >= {bound:g}   {mark}")
            if mark == "MISS":
                projected = results[phase].core_bound_rate() / max(results[other].core_bound_rate(), 1e-9)
                print(f"    where the time goes: {phase} {results[phase].breakdown()} µs/msg; {other} "
                      f"{results[other].breakdown()} µs/msg; with one core per process the ratio would be "
                      f"{projected:.2f}")
            summary.append(f"{phase}/{other} {ratio:.2f} (>= {bound:g} {mark})")
    for http in http_results:
        for line in http.describe():
            print("  " + line)
        summary.append(f"{http.name} " + (", ".join(http.verdicts()) if http.ingest else ", ".join(
            f"{w} {http.per_event(w):,.0f} µs/event" for w in http.accepted)))
    summary += verdicts(results)
    summary += steady_verdicts(results, fixed_results)
    summary += rtt_verdict(rtt_results, latencies, args.partitions)
    lost = [name for name, result in [*results.items(), *fixed_results.items()] if not result.complete]
    lost += [http.name for http in http_results if not http.complete]
    if failover is not None:
        print("  " + failover.describe(args.failover_rtt_ms / 1e3))
        summary.append(f"failover lost {failover.lost:,} (target 0 {'PASS' if failover.lost == 0 else 'MISS'})")
        if failover.lost:
            lost.append("failover")
        if failover.failures:  # a worker that exits non-zero is a failure to scripts and supervisors
            summary.append(f"failover worker exits {failover.exit_codes} (target all 0 MISS)")
    if failed is not None:
        print(f"FAILED: {failed}")
    if lost:
        print(f"FAILED: messages lost in {', '.join(lost)}")
    print(f"cluster ({args.messages:,} msgs): " + " | ".join(summary))
    return 1 if lost or failed is not None else 0


if __name__ == "__main__":
    raise SystemExit(main())
