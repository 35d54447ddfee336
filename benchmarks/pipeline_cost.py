"""CPU per message of egress's own half: source → log → partition job → process function → outbox commit.

The delivery benchmark (``benchmarks/delivery.py``) measures egress end to end against nginx, where
the sink, libcurl and the server take their share of the same 2 cores. This one takes the HTTP part
out, to see what the rest costs: the same JSONL source of flight payloads (``delivery.py``'s
``write_source``), the same identity process function, ``partition_count`` 4, full durability
(SQLite ``synchronous=FULL``), but the sink is :class:`InstantSink`, which acknowledges every message
as soon as it is distributed (nothing leaves the process). ``egress run --until-drained`` runs in a
subprocess from a fresh state directory; a thread inside it samples ``/proc/self/task/*/stat`` every
50 ms and names each thread, so the report splits the CPU by thread: the event loop (partition
jobs, invocation, distribution), the SQLite thread (commits, reads, fsync), the source's worker thread
(JSONL parsing and keying).

Run it from the repository root (figures: ``docs/benchmarks.md``, "Session 4: per-message cost")::

    python benchmarks/pipeline_cost.py                   # 100,000 messages, 3 runs
    python benchmarks/pipeline_cost.py --messages 200000 --runs 1 --profile   # + py-spy (--gil and not)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

SINK_CLASS = "benchmark_instant_ack"


class _NoParameters(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InstantSink:
    """A sink that acknowledges each distributed message at once (on the next event-loop turn it
    wakes its job, as a real sink's acknowledgement would): what is left is egress's own cost."""

    parameters_model: ClassVar[type[BaseModel]] = _NoParameters
    dynamic_parameters_model: ClassVar[type[BaseModel]] = _NoParameters

    @classmethod
    def check(cls, parameters: Any, input_streams: dict[str, Any]) -> list[Any]:
        return []

    @classmethod
    def create(cls, context: Any, parameters: Any, dynamic_parameters: Any, progress: Any) -> InstantSink:
        return cls(context, progress)

    def __init__(self, context: Any, progress: Any) -> None:
        self._context = context
        self._progress = progress
        self._last: Any = None
        self._held = 0

    def distribute(self, messages: list[Any]) -> None:
        if messages:
            import asyncio
            self._last = messages[-1]
            self._held += len(messages)
            asyncio.get_running_loop().call_soon(self._acknowledge)

    def _acknowledge(self) -> None:
        from egress.engines import SinkProgress
        if self._last is not None:
            self._progress = SinkProgress("", self._last.message_id, self._last.seq, b"")
            self._last = None
            self._held = 0
        self._context.on_progress(self._progress)

    def progress(self) -> Any:
        return self._progress

    def committed(self, progress: Any) -> None:
        pass

    def flush(self) -> None:
        pass

    def hold(self) -> None:
        pass

    def resume(self) -> None:
        pass

    @property
    def in_flight(self) -> int:
        return 0  # acknowledged at once: nothing is ever in flight

    @property
    def unacknowledged(self) -> int:
        return self._held

    @property
    def terminal_error(self) -> str | None:
        return None

    def reconfigure(self, dynamic_parameters: Any) -> None:
        pass

    async def close(self) -> None:
        pass


def _thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by native thread id."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as stat:
                text = stat.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        found[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def child(argv: list[str]) -> int:
    """Inside the measured process: register :class:`InstantSink`, sample the threads, run egress."""
    from egress.cli.main import app
    from egress.connectors import SINKS

    SINKS.register(SINK_CLASS)(InstantSink)
    report, rest = Path(argv[0]), argv[1:]
    cpu: dict[str, float] = {}
    names: dict[int, str] = {}
    stop = threading.Event()

    def sample() -> None:
        me = threading.get_native_id()
        while True:
            for thread in threading.enumerate():
                if thread.native_id is not None:
                    names[thread.native_id] = thread.name
            for tid, seconds in _thread_cpu().items():
                name = "sampler" if tid == me else names.get(tid, f"thread {tid}")
                # executor threads come and go: sum by name over the thread ids seen
                cpu[f"{name}\x1f{tid}"] = seconds
            if stop.wait(0.05):
                return

    sampler = threading.Thread(target=sample, name="sampler", daemon=True)
    sampler.start()
    code = 0
    try:
        app(rest, prog_name="egress")
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    finally:
        stop.set()
        sampler.join()
        by_name: dict[str, float] = {}
        for name_and_tid, seconds in cpu.items():
            name = name_and_tid.split("\x1f")[0]
            name = "asyncio worker" if name.startswith("asyncio_") else name
            by_name[name] = by_name.get(name, 0.0) + seconds
        report.write_text(json.dumps(by_name))
    return code


def run_once(work: Path, messages: int, partitions: int, profile: str | None,
             source_tree: Path | None = None) -> dict[str, Any]:
    """One ``egress run --until-drained`` of ``messages`` payloads into :class:`InstantSink`."""
    from delivery import FUNCTIONS_MODULE, benchmark_spec, build_bodies, write_source

    phase = work / "run"
    shutil.rmtree(phase, ignore_errors=True)
    phase.mkdir(parents=True)
    (phase / "functions.py").write_text(FUNCTIONS_MODULE)
    source = phase / "payloads.jsonl"
    write_source(source, build_bodies(min(messages, 100_000)), messages)
    spec = benchmark_spec("pipeline_cost_benchmark", partitions, source, {"instant": {"sink_class_name": SINK_CLASS}})
    spec_path = phase / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    threads = phase / "threads.json"
    report = phase / "report.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(threads), "run", str(spec_path),
               "--state-dir", str(phase / "state"), "--until-drained", "--quiet", "--report", str(report)]
    if profile is not None:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        gil = ["--gil"] if profile.endswith("gil") else []
        command = [py_spy, "record", *gil, "-f", "raw", "-r", "250", "-o", str(work / f"profile-{profile}.txt"),
                   "--", *command]
    paths = [str(phase), *([str(source_tree / "src")] if source_tree is not None else [])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]))
    started = time.perf_counter()
    done = subprocess.run(command, cwd=phase, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"egress exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    by_thread = json.loads(threads.read_text())
    stats = json.loads(report.read_text())
    return {"seconds": seconds, "threads": by_thread, "report": stats}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="one more run under py-spy --gil and one under py-spy (raw profiles kept in --keep)")
    parser.add_argument("--keep", type=Path, help="keep the work directory (Spec, state, profiles) here")
    parser.add_argument("--compare", type=Path, metavar="TREE",
                        help="another egress tree (e.g. `git archive main` unpacked): runs alternate between it "
                             "(\"before\") and this one (\"after\"), --runs each")
    args = parser.parse_args(argv)
    print(f"pipeline_cost: {args.messages:,} messages, {args.partitions} partitions, instant sink; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="egress-cost-") as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        trees: list[tuple[str, Path | None]] = [("before", args.compare), ("after", None)] if args.compare else [
            ("", None)]
        rates: dict[str, list[float]] = {label: [] for label, _ in trees}
        costs: dict[str, list[float]] = {label: [] for label, _ in trees}
        for index in range(args.runs):
            for label, tree in trees:
                result = run_once(work, args.messages, args.partitions, None, tree)
                threads = result["threads"]
                total = sum(threads.values())
                per = {name: seconds / args.messages * 1e6 for name, seconds in threads.items()}
                rate = args.messages / result["seconds"]
                rates[label].append(rate)
                costs[label].append(total / args.messages * 1e6)
                split = ", ".join(f"{name} {us:.1f}" for name, us in sorted(per.items(), key=lambda kv: -kv[1])
                                  if us >= 0.05)
                print(f"run {index + 1}{' ' + label if label else ''}: {rate:,.0f} msg/s ({result['seconds']:.2f} s "
                      f"wall), CPU {total:.2f} s = {total / args.messages * 1e6:.1f} µs/msg [{split}]; epochs "
                      f"{result['report'].get('epochs', 0):,}; load {os.getloadavg()[0]:.2f}", flush=True)
        if args.profile:
            for kind in ("gil", "cpu"):
                run_once(work, args.messages, args.partitions, kind)
                print(f"profile ({kind}): {work / f'profile-{kind}.txt'}", flush=True)
        for label, _ in trees:
            if costs[label]:
                print(f"pipeline_cost{' ' + label if label else ''} ({args.messages:,} msgs, {args.partitions} "
                      f"partitions): CPU {min(costs[label]):.1f} µs/msg (best of {args.runs}; all "
                      f"{' / '.join(f'{c:.1f}' for c in costs[label])}), {max(rates[label]):,.0f} msg/s (best; all "
                      f"{' / '.join(f'{r:,.0f}' for r in rates[label])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
