"""``python -m egress`` with a deterministic profile over a window the caller chooses: SIGUSR1
starts :mod:`cProfile` (in the main thread, which runs the event loop), SIGUSR2 stops it and writes
its stats to ``EGRESS_PROFILE_OUT`` (a :mod:`pstats` file). Call counts, unlike sampled or timed
figures, do not move with the machine's load: ``benchmarks/cluster_idle.py --cprofile`` divides
them by the window's seconds to name what an idle worker does per second.

    EGRESS_PROFILE_OUT=w1.prof python benchmarks/profiled_worker.py run SPEC --engine nats://...
"""

from __future__ import annotations

import cProfile
import os
import signal
import sys
from types import FrameType

PROFILER = cProfile.Profile()


def _start(_signum: int, _frame: FrameType | None) -> None:
    PROFILER.enable()


def _stop(_signum: int, _frame: FrameType | None) -> None:
    PROFILER.disable()
    PROFILER.dump_stats(os.environ["EGRESS_PROFILE_OUT"])


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
    from egress.cli.main import main

    sys.argv[0] = "egress"
    main()
