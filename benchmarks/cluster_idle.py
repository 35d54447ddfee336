"""What an idle cluster costs (issue 24, point 3): CPU seconds per second of each worker and of the
nats-server while nothing arrives.

A fresh ``nats-server -js`` (from the venv, loopback, a temporary store) and ``--workers`` processes
``egress run SPEC --engine nats://… --worker-id wI`` (no ``--until-drained``: they run until told to
stop) on ``benchmarks/delivery.py``'s pipeline (identity function, async HTTP sink, ``--partitions``
partitions) whose source is a followed glob of ``--files`` empty JSONL files read by one reader per
worker: no record ever arrives, so whatever CPU the processes use is the cluster's idle cost. After
``--settle`` seconds (every unit taken: each worker's ``/status`` is not read, the settle time is
several lease heartbeats), the CPU of every process (``/proc/<pid>/stat``) and the server's traffic
(``/varz``, ``/jsz``) are read, again ``--seconds`` later, and the differences printed per second.
Figures from a loaded machine vary by a few ms/s: CPU seconds, not wall rates, are what is compared.

    PYTHONPATH=src .venv/bin/python benchmarks/cluster_idle.py --workers 2 --seconds 20
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from tests.nats_server import NatsServer  # noqa: E402

from cluster_counters import process_cpu, server_counters  # noqa: E402
from delivery import FUNCTIONS_MODULE, benchmark_spec, compile_egress  # noqa: E402
from nats_tally import Tally  # noqa: E402


def write_spec(phase: Path, workers: int, files: int, partitions: int, follow: bool = True) -> Path:
    """The delivery pipeline reading ``files`` empty followed files with ``workers`` readers (not
    followed: read to the end at once, as a drained ``benchmarks/cluster.py`` phase's)."""
    folder = phase / "source"
    folder.mkdir()
    for number in range(files):
        (folder / f"part-{number:02d}.jsonl").write_bytes(b"")
    (phase / "functions.py").write_text(FUNCTIONS_MODULE)
    sink = {"sink_class_name": "NYT::NFlow::TAsyncHttpSink",
            "parameters": {"url": "http://127.0.0.1:9/idle", "payload_column": "payload"}}
    spec = benchmark_spec("idle_benchmark", partitions, folder / "*.jsonl", {"http": sink})
    spec["sources"]["payloads"]["parameters"] = {"path": str(folder / "*.jsonl"), "follow": follow, "readers": workers}
    path = phase / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def measure(work: Path, workers: int, files: int, partitions: int, settle: float, seconds: float,
            instructions: bool = False, callgrind: bool = False, cprofile: bool = False,
            follow: bool = True) -> list[str]:
    """Start the cluster, let it settle, and measure its idle CPU and traffic over ``seconds``; with
    ``instructions``, each worker under ``valgrind --tool=cachegrind --cache-sim=no``, its whole
    process's instructions printed (start, ``settle + seconds`` idle, stop: two runs of different
    ``seconds`` give the instructions per idle second); with ``callgrind``, each worker under
    ``valgrind --tool=callgrind --dump-instr=no``, its counters zeroed at the window's start and
    dumped at its end (``callgrind_control``): the instructions of the window alone, per second, and
    the functions that spent the most of them (inclusive); with ``cprofile``, each worker under
    ``benchmarks/profiled_worker.py``, profiled over the window: its Python calls per second."""
    compile_egress()
    spec = write_spec(work, workers, files, partitions, follow)
    server = NatsServer(work / "nats").start()
    assert server.pid is not None
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs = []
    try:
        for index in range(1, workers + 1):
            name = f"w{index}"
            log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            command = [sys.executable, "-m", "egress", "run", str(spec), "--engine", server.url, "--worker-id", name,
                       "--state-dir", str(work / f"state-{name}"), "--quiet"]
            environment = None
            if instructions:
                command = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                           f"--cachegrind-out-file={work / f'cachegrind-{name}.out'}", *command]
            elif callgrind:
                command = ["valgrind", "--tool=callgrind", "--dump-instr=no",
                           f"--callgrind-out-file={work / f'callgrind-{name}.out'}", *command]
            elif cprofile:
                command[1:3] = [str(HERE / "profiled_worker.py")]
                environment = {**os.environ, "EGRESS_PROFILE_OUT": str(work / f"profile-{name}.prof")}
            processes[name] = subprocess.Popen(command, cwd=work, stdout=log, stderr=subprocess.STDOUT,
                                               env=environment)
        time.sleep(settle)
        if callgrind:
            for process in processes.values():
                subprocess.run(["callgrind_control", "--zero", str(process.pid)], check=True, capture_output=True)
        if cprofile:
            for process in processes.values():
                process.send_signal(signal.SIGUSR1)
        pids = {name: process.pid for name, process in processes.items()} | {"nats-server": server.pid}
        before = {name: process_cpu(pid) for name, pid in pids.items()}
        tally = Tally(server.url)
        tally.start()
        traffic = server_counters(server)
        started = time.perf_counter()
        time.sleep(seconds)
        if callgrind:
            for process in processes.values():
                subprocess.run(["callgrind_control", "--dump=window", str(process.pid)], check=True,
                               capture_output=True)
        if cprofile:
            for process in processes.values():
                process.send_signal(signal.SIGUSR2)
        elapsed = time.perf_counter() - started
        after = {name: process_cpu(pid) for name, pid in pids.items()}
        traffic_after = server_counters(server)
        kinds = tally.stop()
        for name, process in processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited {process.returncode} while idle: see {work / name}.log")
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(120 if instructions else 30)  # leaving takes seconds under valgrind
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
        server.stop()
    per = {name: 1e3 * (after[name] - before[name]) / elapsed for name in pids}
    counted = [f"{name} {instructions_of(work / f'cachegrind-{name}.out') / 1e6:,.0f} M"
               for name in processes if (work / f"cachegrind-{name}.out").exists()]
    rates = {name: (traffic_after[name] - traffic[name]) / elapsed for name in traffic}
    return [f"idle cluster of {workers} workers ({partitions} partitions, {workers} readers of {files} "
            f"{'followed' if follow else 'finished'} empty files), {elapsed:.1f} s measured after {settle:g} s:",
            "CPU ms per second: " + ", ".join(f"{name} {value:.1f}" for name, value in per.items())
            + f"; all {sum(per.values()):.1f}",
            f"nats-server per second: {rates['in_msgs']:.1f} messages in, {rates['out_msgs']:.1f} out, "
            f"{rates['api']:.1f} JetStream API requests",
            "messages per second per worker, by kind (a core subscription to '>'; each message "
            "once, whoever receives it): " + "; ".join(f"{kind} {count / elapsed / workers:.2f}"
                                                       for kind, count in kinds.most_common()),
            *([f"instructions of each worker's whole process (cachegrind): {', '.join(counted)}"] if counted else []),
            *(window_notes(work, list(processes), elapsed) if callgrind else []),
            *(profile_notes(work, list(processes), elapsed) if cprofile else [])]


def window_notes(work: Path, names: list[str], seconds: float, top: int = 25) -> list[str]:
    """Each worker's instructions per second over the window (its callgrind dump), then the
    functions of the first worker that spent the most themselves (exclusive: the interpreter's
    recursion makes every inclusive C figure the whole), per second."""
    dumps = {name: sorted(work.glob(f"callgrind-{name}.out.*")) for name in names}
    totals = {name: callgrind_total(found[0]) for name, found in dumps.items() if found}
    lines = ["instructions per second of each worker over the window (callgrind): "
             + ", ".join(f"{name} {total / seconds / 1e6:,.1f} M" for name, total in totals.items())]
    if totals:
        first = dumps[names[0]][0]
        annotated = subprocess.run(["callgrind_annotate", "--threshold=99", str(first)],
                                   check=True, capture_output=True, text=True).stdout
        rows = [line for line in annotated.splitlines() if re.match(r"^\s*[0-9,]+ \(", line)][:top]
        lines.append(f"{names[0]}'s functions, exclusive instructions per second:")
        lines += [f"  {int(row.split()[0].replace(',', '')) / seconds / 1e3:9,.0f} K  {row.split(None, 2)[-1]}"
                  for row in rows]
    return lines


def callgrind_total(out: Path) -> int:
    """The instructions of a callgrind dump (its ``totals:`` or ``summary:`` line)."""
    return next(int(line.split()[1]) for line in out.read_text().splitlines()
                if line.startswith(("totals:", "summary:")))


def profile_notes(work: Path, names: list[str], seconds: float, top: int = 40) -> list[str]:
    """The first worker's Python functions over the window by calls per second, with their
    cumulative time share (a profile's timing is slowed by the profiling; the counts are not)."""
    import pstats

    found = work / f"profile-{names[0]}.prof"
    if not found.exists():
        return [f"no profile of {names[0]}"]
    stats = pstats.Stats(str(found))
    rows = []
    for (file, line, function), (_, calls, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if "/egress/" in file:
            rows.append((calls / seconds, cumulative / seconds, f"{file.split('/egress/')[-1]}:{line} {function}"))
    rows.sort(reverse=True)
    return [f"{names[0]}'s egress functions by calls per second (cumulative ms per second, profiled):",
            *(f"  {calls:8.2f}/s {cumulative * 1e3:7.2f} ms  {where}" for calls, cumulative, where in rows[:top])]


def instructions_of(out: Path) -> int:
    """The instructions of a cachegrind output (its ``summary:`` line)."""
    return next(int(line.split()[1]) for line in out.read_text().splitlines() if line.startswith("summary:"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--settle", type=float, default=8.0, help="seconds before measuring")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--instructions", action="store_true",
                        help="each worker under valgrind's cachegrind: its whole process's instructions")
    parser.add_argument("--callgrind", action="store_true",
                        help="each worker under valgrind's callgrind: its instructions over the window alone")
    parser.add_argument("--cprofile", action="store_true",
                        help="each worker under cProfile over the window: its Python calls per second")
    parser.add_argument("--finished", action="store_true",
                        help="the files not followed: every reader finished at once, the jobs idle")
    parser.add_argument("--keep", type=Path, help="a directory (new) to keep the run's files in")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="egress-idle-") as temporary:
        work = Path(temporary) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=True)
        for line in measure(work, args.workers, args.files, args.partitions, args.settle, args.seconds,
                            args.instructions, args.callgrind, args.cprofile, not args.finished):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
