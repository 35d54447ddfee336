"""The probe of ``benchmarks/held_memory.py``, imported at start-up by the ``egress run`` it measures
(this directory first on its ``PYTHONPATH``). With ``HELD_PROBE=PREFIX`` set, a daemon thread writes
every 0.25 s one line to ``PREFIX.log``: seconds since start, ``VmRSS``, ``VmHWM``, ``RssAnon``,
``RssFile`` (MB of 1,024 kB, as ``delivery.py``) and, once a second, each async HTTP sink's
unacknowledged (``pending``) and not yet started (``waiting``) deliveries; at ``HELD_MALLOC_AT`` s
(default 10) CPython's allocator statistics (``sys._debugmallocstats``) go to ``PREFIX.malloc``.
With ``HELD_TRACEMALLOC=S`` too, tracemalloc runs (``HELD_FRAMES`` frames, default 1) and a snapshot
is written every S s to ``PREFIX.N.snap``. Without ``HELD_PROBE`` it does nothing."""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import tracemalloc

_STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def _status_mb() -> dict[str, float]:
    with open("/proc/self/status") as status:
        return {line.split(":")[0]: int(line.split()[1]) / 1024 for line in status if line.startswith(_STATUS_FIELDS)}


def _write_malloc_stats(path: str) -> None:
    """``sys._debugmallocstats`` writes to the C stderr: point fd 2 at ``path`` meanwhile."""
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    saved = os.dup(2)
    try:
        os.dup2(target, 2)
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def _sinks() -> str:
    sinks = [o for o in gc.get_objects() if type(o).__name__ == "AsyncHttpSink"]
    return (" pending " + "/".join(str(len(s._pending)) for s in sinks)
            + " waiting " + "/".join(str(len(s._waiting)) for s in sinks))


def _watch(prefix: str, every: float, malloc_at: float) -> None:
    start, snaps, last_snap, malloc_done, ticks = time.monotonic(), 0, 0.0, False, 0
    with open(prefix + ".log", "a", buffering=1) as log:
        while True:
            time.sleep(0.25)
            ticks += 1
            now = time.monotonic() - start
            vm = _status_mb()
            line = (f"{now:.2f} rss {vm['VmRSS']:.1f} hwm {vm['VmHWM']:.1f} anon {vm['RssAnon']:.1f} "
                    f"file {vm['RssFile']:.1f}")
            if ticks % 4 == 0:
                line += _sinks()
            if not malloc_done and now >= malloc_at:
                malloc_done = True
                _write_malloc_stats(prefix + ".malloc")
            if every and now - last_snap >= every:
                last_snap = now
                line += f" traced {tracemalloc.get_traced_memory()[0] / 1e6:.1f} snap {snaps}"
                tracemalloc.take_snapshot().dump(f"{prefix}.{snaps}.snap")
                snaps += 1
            log.write(line + "\n")


def _start() -> None:
    prefix = os.environ.get("HELD_PROBE")
    if not prefix:
        return
    every = float(os.environ.get("HELD_TRACEMALLOC", "0"))
    if every:
        tracemalloc.start(int(os.environ.get("HELD_FRAMES", "1")))
    threading.Thread(target=_watch, args=(prefix, every, float(os.environ.get("HELD_MALLOC_AT", "10"))),
                     daemon=True, name="held-probe").start()


_start()
