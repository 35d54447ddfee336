"""The http ingest phases of ``benchmarks/cluster.py`` (issue 24): N workers accepting webhook events
behind nginx, the CPU of each worker per event it accepted.

The pipeline is ``benchmarks/ingest.py``'s (``benchmarks/latency.py``'s Spec: an ``http`` source,
pass-through, the async HTTP sink to the run's endpoint), with ``partition_count`` 4 and the
source's ``readers`` = N: reader ``k`` listens on ``port + k`` and the assignment gives each worker
one (``docs/sources.md``, "Several readers: every worker accepts"). A fresh ``nats-server -js`` and
N processes ``egress run SPEC --engine nats://… --worker-id wI --http-port …`` (as the NATS phases
start them, without ``--until-drained``: a live source is never drained); nginx in front of the
readers' ports (``tests/nginx.py``'s :func:`~tests.nginx.balancer_config`: ``upstream`` with
``proxy_next_upstream``); once each worker holds one reader and listens, ``benchmarks/ingest.py``'s
64 clients, in a process of their own, POST ``events`` events through nginx, one per request, each
until answered 200 (with ``keyed``, each under an ``Idempotency-Key``).

Two forms per N: ``ingest`` (the computation drops every event, ``tests.pipelines:Drops``, as
``ingest.py``'s "ingest only"), timed until the clients have every 200 (a 200 follows its commit);
``relay`` (delivered to the endpoint), timed until the workers' sinks have delivered every event.
CPU (``/proc/<pid>/stat``: all threads) of each worker, nats-server, nginx (master and workers)
and the clients' process over that window only (start-up and joining left out); each worker's
events accepted from its ``/metrics`` (``egress_source_rows_total``), and its source and job commits
(``egress_source_commits_total``, ``egress_epochs_committed_total``: the events per source commit).
Every event answered 200 must be counted (ingest: the source rows of all workers; relay: distinct
idempotency keys at the endpoint), or the phase is incomplete.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from benchmarks.ingest import ingest_spec  # noqa: E402
from examples.cluster.demo import Leases  # noqa: E402
from examples.cluster.ingest import consecutive_free_ports, metric  # noqa: E402
from tests.nats_server import NatsServer  # noqa: E402
from tests.nginx import Nginx, balancer_config, free_port  # noqa: E402

from cluster_counters import process_cpu, races_lost, server_counters, traffic_note  # noqa: E402

INGEST_TARGET = 100.0
"""Issue 24: CPU µs per event a worker accepts, in the ingest form, at most this."""
PARTITIONS = 4
SOURCE = "input"  # the source's id in ingest.py's Spec
PIPELINE = "latency"  # and its pipeline's name


def family_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its children (nginx's master and its workers)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return process_cpu(pid) + sum(process_cpu(int(child)) for child in children)


@dataclass
class IngestResult:
    """One form on N workers: events answered 200, counted, the window and each process's CPU."""

    name: str
    events: int
    seconds: float
    accepted: dict[str, float]  # worker → events it accepted (its source rows)
    counted: int  # ingest: source rows of every worker; relay: distinct keys at the endpoint
    cpu: dict[str, float]  # process → CPU seconds over the window
    load: float
    profiles: dict[str, Path] = field(default_factory=dict)  # worker → its py-spy raw samples (``profile``)
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.counted >= self.events

    @property
    def ingest(self) -> bool:
        return self.name.endswith("ingest")

    def per_event(self, worker: str) -> float:
        """A worker's CPU µs per event it accepted."""
        accepted = self.accepted.get(worker, 0.0)
        return 1e6 * self.cpu[worker] / accepted if accepted else float("inf")

    def verdicts(self) -> list[str]:
        """Each worker against :data:`INGEST_TARGET` (the ingest form's target)."""
        return [f"{worker} {self.per_event(worker):,.0f} µs/event "
                f"({'PASS' if self.per_event(worker) <= INGEST_TARGET else 'MISS'})" for worker in self.accepted]

    def describe(self) -> list[str]:
        workers = sum(self.cpu[w] for w in self.accepted)
        check = "OK" if self.complete else f"LOST {self.events - self.counted:,}"
        lines = [f"{self.name:<14} {self.events / self.seconds:>7,.0f} events/s  {self.seconds:6.2f} s  counted "
                 f"{self.counted:,}/{self.events:,} ({check}); load average {self.load:.2f} at its start",
                 "  per worker (CPU µs per event it accepted): " + ", ".join(
                     f"{w} {self.per_event(w):,.0f} ({self.accepted[w]:,.0f} events)" for w in self.accepted)
                 + f"; all workers {1e6 * workers / self.events:,.0f} per event",
                 "  others per event: " + ", ".join(f"{name} {1e6 * seconds / self.events:,.0f}"
                                                    for name, seconds in self.cpu.items()
                                                    if name not in self.accepted)]
        lines += ["  " + note for note in self.notes]
        if self.ingest:
            lines.append(f"  target <= {INGEST_TARGET:g} µs per worker: " + ", ".join(self.verdicts()))
        return lines


def commits_note(accepted: dict[str, float], counts: dict[str, tuple[float, float]]) -> str:
    """Each worker's source commits (and the events each carried, on average) and its partition jobs'
    commits, counted from start-up (the few before the clients' window included)."""
    return "commits: " + ", ".join(
        f"{worker} {source:,.0f} source ({accepted[worker] / max(source, 1):.1f} events each), {jobs:,.0f} job"
        for worker, (source, jobs) in counts.items())


def wait_for(condition: Callable[[], bool], what: str, timeout: float) -> None:
    """Poll ``condition()`` every 50 ms until true; ``RuntimeError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def ready(leases: Leases, workers: list[str], ports: list[int], relay: bool) -> bool:
    """Each worker holds one reader (and, relaying, some of the partitions) and every port listens."""
    readers = leases.owners(f"source:{SOURCE}")
    if len(readers) != len(ports) or set(readers.values()) != set(workers):
        return False
    if relay and len(set(leases.owners("deliver").values())) < min(len(workers), PARTITIONS):
        return False
    return all(listening(port) for port in ports)


def run_http_phase(work: Path, endpoint: str, count_delivered: Callable[[], int], workers: int, events: int,
                   relay: bool, timeout: float, keyed: bool = False, profile_rate: int = 0,
                   instructions: bool = False) -> IngestResult:
    """One form (``relay`` or ingest only) on ``workers`` workers; ``endpoint``: the sink's URL;
    ``count_delivered()``: distinct idempotency keys the endpoint has answered 2xx (relay, called
    once the workers are stopped); ``profile_rate`` (Hz, 0: none): each worker sampled over the
    window by ``py-spy record --pid --gil --threads -f raw`` (its CPU figure then includes
    py-spy's pauses); ``instructions``: each worker under ``valgrind --tool=callgrind
    --instr-atstart=no``, counting only over the window (``callgrind_control -i on`` / ``off``), its
    instructions per event in the notes (a count that does not move with the load; its
    ``callgrind-<worker>.out`` says where they go). Raises ``RuntimeError`` when a worker dies or a
    wait times out."""
    name = f"http-{workers} {'relay' if relay else 'ingest'}" + (" keyed" if keyed else "")
    phase = work / name.replace(" ", "-")
    phase.mkdir(parents=True)
    base = consecutive_free_ports(workers)
    ports = [base + k for k in range(workers)]
    spec, dynamic = ingest_spec(phase, endpoint, {"source_class_name": "http",
                                                  "parameters": {"port": base, "readers": workers}},
                                relay, partition_count=PARTITIONS)
    server = NatsServer(phase / "nats").start()
    balancer = free_port()
    nginx = Nginx(phase / "nginx", balancer, balancer_config(balancer, ports))
    names = [f"w{index}" for index in range(1, workers + 1)]
    metrics_ports = {worker: free_port() for worker in names}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    leases: Leases | None = None
    try:
        nginx.start()
        assert server.pid is not None
        assert nginx.process is not None
        for worker in names:
            command = [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic), "--engine",
                       server.url, "--worker-id", worker, "--state-dir", str(phase / f"state-{worker}"),
                       "--http-port", str(metrics_ports[worker]), "--quiet"]
            if instructions:
                command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                           f"--callgrind-out-file={phase / f'callgrind-{worker}.out'}", *command]
            with (phase / f"{worker}.log").open("wb") as log:
                processes[worker] = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        leases = Leases(server.url, PIPELINE)
        wait_for(lambda: ready(leases, names, ports, relay) or any(p.poll() is not None for p in processes.values()),
                 "each worker holding one http reader, listening", timeout)
        check_alive(processes, phase)
        pids = {**{worker: process.pid for worker, process in processes.items()}, "nats-server": server.pid}
        load = os.getloadavg()[0]
        before = {name: process_cpu(pid) for name, pid in pids.items()}
        before["nginx"] = family_cpu(nginx.process.pid)
        traffic = server_counters(server)
        profilers = {worker: profiler(process.pid, phase / f"profile-{worker}.txt", profile_rate)
                     for worker, process in processes.items()} if profile_rate else {}
        if instructions:
            for process in processes.values():
                callgrind_control(process.pid, "on")
        started = time.perf_counter()
        clients = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "ingest.py"), "--post-to",
                                    f"{nginx.url}/events", "--events", str(events), *(["--keyed"] if keyed else [])],
                                   cwd=REPO)
        _, status, usage = os.wait4(clients.pid, 0)
        clients.returncode = os.waitstatus_to_exitcode(status)
        if clients.returncode != 0:
            raise RuntimeError(f"{name}: the clients exited {clients.returncode}")
        if relay:
            wait_for(lambda: sum(metric(port, "egress_sink_records_delivered_total")
                                 for port in metrics_ports.values()) >= events
                     or any(p.poll() is not None for p in processes.values()),
                     f"{events:,} events delivered", timeout)
        seconds = time.perf_counter() - started
        if instructions:
            for process in processes.values():
                callgrind_control(process.pid, "off")
        cpu = {name: process_cpu(pid) - before[name] for name, pid in pids.items()}
        cpu["nginx"] = family_cpu(nginx.process.pid) - before["nginx"]
        cpu["clients"] = usage.ru_utime + usage.ru_stime
        notes = [traffic_note(traffic, server_counters(server), events)]
        for profiling in profilers.values():
            profiling.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
            profiling.wait(60)
        check_alive(processes, phase)
        accepted = {worker: metric(port, "egress_source_rows_total") for worker, port in metrics_ports.items()}
        notes.append(commits_note(accepted, {worker: (metric(port, "egress_source_commits_total"),
                                                      metric(port, "egress_epochs_committed_total"))
                                             for worker, port in metrics_ports.items()}))
    finally:
        if leases is not None:
            leases.close()
        for process in processes.values():
            stop(process, 300 if instructions else 20)
        nginx.stop()
        server.stop()
    for worker in processes:
        out = phase / f"callgrind-{worker}.out"
        if instructions and out.exists():
            notes.append(instructions_note(worker, out, accepted[worker]))
    notes.append("log-append races lost: " + ", ".join(f"{worker} {races_lost(phase / f'{worker}.log'):,}"
                                                       for worker in processes))
    counted = count_delivered() if relay else int(sum(accepted.values()))
    return IngestResult(name, events, seconds, accepted, counted, cpu, load,
                        {worker: phase / f"profile-{worker}.txt" for worker in profilers}, notes)


def profiler(pid: int, raw: Path, rate: int) -> subprocess.Popen[bytes]:
    """``py-spy record`` attached to ``pid`` until SIGINT, its samples (the thread holding the GIL) to ``raw``."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--gil", "--threads", "--full-filenames", "-f",
                             "raw", "-r", str(rate), "-o", str(raw)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def check_alive(processes: dict[str, subprocess.Popen[bytes]], phase: Path) -> None:
    for worker, process in processes.items():
        if process.poll() is not None:
            tail = (phase / f"{worker}.log").read_text(errors="replace").strip()[-1500:]
            raise RuntimeError(f"{worker} exited {process.returncode}: {tail}")


def callgrind_control(pid: int, instrumentation: str) -> None:
    """Switch the instrumentation of the worker ``pid`` under callgrind ``on`` or ``off``."""
    subprocess.run(["callgrind_control", "-i", instrumentation, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   timeout=120)


def instructions_note(worker: str, out: Path, accepted: float) -> str:
    """A worker's instructions over the window (callgrind's ``totals:``: its ``summary:`` says 0 when
    the instrumentation started off), in all and per event it accepted."""
    total = next(int(line.split()[1]) for line in out.read_text().splitlines() if line.startswith("totals:"))
    return (f"{worker} instructions over the window (callgrind): {total / 1e6:,.0f} M, "
            f"{total / accepted / 1e3:,.1f} K per event it accepted")


def stop(process: subprocess.Popen[bytes], wait: float = 20) -> None:
    """SIGTERM by its PID, SIGKILL after ``wait`` s."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(wait)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
