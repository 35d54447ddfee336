"""Where the memory of the async HTTP sink's held (unacknowledged) messages goes, while egress drains a
backlog to nginx (issue 25 point 2; ``delivery.py``'s backlog phase, whose peak RSS target is 80 MB).

Each tree (a ``src`` directory, given by ``--trees``; the default is this checkout's) runs one ``egress
run`` of ``delivery.py``'s backlog phase (``--messages`` payloads cycled, 4 partitions, default sink
parameters) with the probe ``benchmarks/held_probe/sitecustomize.py`` on its ``PYTHONPATH``. Printed
per tree: ``VmHWM`` (the peak RSS, as ``delivery.py`` reports it), the median ``VmRSS`` and ``RssAnon``
while draining, the sinks' held messages (sum over the partitions' sinks, median and largest of the
once-a-second samples) and CPython's small-object allocator at 10 s (arenas of 1 MiB, bytes in
objects; not under ``--tracemalloc``, whose allocator hooks hide it).
Against the first tree, each later one's RSS per held message more (median RSS difference / median
held difference).

With ``--tracemalloc S`` the runs are under tracemalloc (one frame: about 3 × slower; a snapshot every
S s) and the largest differences by source line between the trees' snapshots number ``--snapshot``
(default: the middle one of the drain) are printed: what a held message is made of.

Run it from the repository root, under the benchmarks' lock on a shared machine (docs/benchmarks.md,
session 16)::

    python benchmarks/held_memory.py --trees /tmp/ep32/src,/tmp/ep128/src
    python benchmarks/held_memory.py --trees /tmp/ep32/src,/tmp/ep128/src --messages 150000 --tracemalloc 8
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from delivery import NginxTarget, build_bodies, describe, find_or_install_nginx, run_egress

HERE = Path(__file__).resolve().parent
PROBE = HERE / "held_probe"
SETTLE_SECONDS = 5.0  # the samples before this (start-up, the first epochs) are not the drain's


@dataclass
class Drain:
    tree: str
    hwm_mb: float
    rss_mb: float  # median VmRSS after SETTLE_SECONDS
    anon_mb: float
    held: float  # median of the sinks' summed pending deliveries
    held_max: int
    arenas: str
    prefix: str


def _parse(prefix: str, tree: str, hwm: float) -> Drain:
    rss, anon, held = [], [], []
    for line in Path(prefix + ".log").read_text().splitlines():
        fields = line.split()
        if float(fields[0]) < SETTLE_SECONDS:
            continue
        rss.append(float(fields[2]))
        anon.append(float(fields[6]))
        if "pending" in fields:
            held.append(sum(int(n) for n in fields[fields.index("pending") + 1].split("/") if n))
    malloc = Path(prefix + ".malloc")
    text = malloc.read_text() if malloc.exists() else ""
    arenas = re.search(r"# arenas allocated current\s*=\s*(\d+)", text)
    used = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    summary = (f"{arenas.group(1)} arenas, {int(used.group(1).replace(',', '')) / 1e6:.1f} MB in objects"
               if arenas and used else "no allocator statistics")
    return Drain(tree, hwm, statistics.median(rss or [0.0]), statistics.median(anon or [0.0]),
                 statistics.median(held or [0]), max(held or [0]), summary, prefix)


def _lines(path: str) -> dict[tuple[str, int], tuple[int, int]]:
    """A snapshot's bytes and blocks by source line, the tree's own prefix taken off the file names."""
    snapshot = tracemalloc.Snapshot.load(path).filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    found: dict[tuple[str, int], tuple[int, int]] = {}
    for stat in snapshot.statistics("lineno"):
        frame = stat.traceback[0]
        name = re.sub(r"^.*?/src/(egress/)", r"\1", frame.filename)
        name = re.sub(r"^.*/egress-backlog/", "", name)
        size, count = found.get((name, frame.lineno), (0, 0))
        found[(name, frame.lineno)] = (size + stat.size, count + stat.count)
    return found


def _diff(first: Drain, other: Drain, snapshot: int | None, rows: int) -> list[str]:
    if snapshot is None:
        written = min(len(list(Path(d.prefix).parent.glob(Path(d.prefix).name + ".*.snap"))) for d in (first, other))
        snapshot = written // 2
    a = _lines(f"{first.prefix}.{snapshot}.snap")
    b = _lines(f"{other.prefix}.{snapshot}.snap")
    total_a, total_b = sum(s for s, _ in a.values()), sum(s for s, _ in b.values())
    out = [f"tracemalloc snapshot {snapshot}: {total_a / 1e6:.2f} MB → {total_b / 1e6:.2f} MB; by line, "
           "bytes and blocks more (and as many in the second tree):"]
    keys = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, (0, 0))[0] - a.get(k, (0, 0))[0]))
    for key in keys[:rows]:
        (size_a, count_a), (size_b, count_b) = a.get(key, (0, 0)), b.get(key, (0, 0))
        out.append(f"  {(size_b - size_a) / 1e3:+8.0f} KB {count_b - count_a:+7d} blocks "
                   f"({size_b / 1e3:6.0f} KB {count_b:6d})  {key[0]}:{key[1]}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default=str(HERE.parent / "src"),
                        help="comma-separated src directories, each run in turn (default: this checkout's)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="backlog size (default 1,000,000)")
    parser.add_argument("--tracemalloc", type=float, default=0.0, metavar="S",
                        help="run under tracemalloc, a snapshot every S s (default: off)")
    parser.add_argument("--snapshot", type=int, default=None,
                        help="the snapshot compared (default: the middle one of those both runs wrote)")
    parser.add_argument("--rows", type=int, default=16, help="lines of the comparison (default 16)")
    args = parser.parse_args(argv)
    nginx = find_or_install_nginx()
    if nginx is None:
        print("held_memory: nginx unavailable, nothing to measure")
        return 1
    bodies = build_bodies(100_000)
    drains: list[Drain] = []
    with tempfile.TemporaryDirectory(prefix="egress-held-") as temporary:
        work = Path(temporary)
        for index, tree in enumerate(args.trees.split(",")):
            prefix = str(work / f"tree{index}")
            environment = {"PYTHONPATH": f"{PROBE}:{tree}", "HELD_PROBE": prefix}
            if args.tracemalloc:
                environment["HELD_TRACEMALLOC"] = str(args.tracemalloc)
            target = NginxTarget(nginx, work)
            target.start()
            print(f"{tree}: draining {args.messages:,} messages, load average {os.getloadavg()[0]:.2f}", flush=True)
            result = run_egress(target, bodies, args.messages, 4, None, work, 3600, name="egress backlog",
                                environment=environment)
            print("  " + describe(result), flush=True)
            drain = _parse(prefix, tree, result.max_rss_mb)
            drains.append(drain)
            print(f"  VmHWM {drain.hwm_mb:.1f} MB; draining: VmRSS {drain.rss_mb:.1f} MB, RssAnon {drain.anon_mb:.1f} "
                  f"MB, held {drain.held:,.0f} (largest {drain.held_max:,}); {drain.arenas}; "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)
        first = drains[0]
        for other in drains[1:]:
            more = other.held - first.held
            if more > 0:
                print(f"{other.tree} against {first.tree}: {more:,.0f} held more, RSS "
                      f"{(other.rss_mb - first.rss_mb) * 1024 / more:.2f} kB and VmHWM "
                      f"{(other.hwm_mb - first.hwm_mb) * 1024 / more:.2f} kB per held message more")
            if args.tracemalloc:
                print("\n".join(_diff(first, other, args.snapshot, args.rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
