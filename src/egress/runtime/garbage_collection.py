"""The garbage collector's settings for a running pipeline (``egress run`` calls
:func:`tune_for_run` before it runs one).

A pipeline allocates container objects per message (rows, messages, deliveries, requests) that
live from a read to an acknowledgement, milliseconds to seconds. With CPython's default thresholds
(700, 10, 10) a young collection runs every 700 net allocations, finds those objects still alive,
and promotes them, so the older generations fill with objects about to die and are traversed again
and again, the third one with every module, class and Spec object of the process. Measured on the
delivery benchmark (100,000 messages, 4 partitions, nginx; ``docs/benchmarks.md``):
1,075-1,109 young, 98-101 middle and 9 full collections took 0.8-1.0 s of CPU, 8-9 % of the run;
with the settings below, 70 young, 6 middle and 1 full collection took 0.1 s.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000
"""Net container allocations between young collections (CPython's default: 700). Reference cycles
still go within that many allocations; RSS grows by at most what that many objects hold."""

OLDER_THRESHOLDS = (20, 20)
"""Young collections per middle one, and middle ones per full one (CPython's default: 10, 10)."""


def tune_for_run() -> None:
    """Raise the collector's thresholds (see the module docs). Process-wide; call it once, before the
    pipeline runs. (``gc.freeze()`` of start-up's objects as well was measured and not kept: with the
    frozen objects no longer counted as long-lived, full collections came more often, and the
    collector's CPU was about twice the thresholds' alone, 0.16-0.20 against 0.07-0.10 s.)"""
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)


def settle_for_exit() -> None:
    """Collect the garbage of a finished run, then freeze every object still alive (``gc.freeze``):
    the interpreter's exit would otherwise traverse them all again in its own collections, 78 M of
    a 300-message run's 1,530 M instructions (``docs/benchmarks.md``, Session 11 — start-up). Every
    object is still freed at exit as before, by reference counting; only the reference cycles that
    the exit itself leaves are not collected, which Python does not promise anyway (``__del__`` of
    an object alive at exit). For a process that ends: the collector no longer frees frozen cycles."""
    gc.collect()
    gc.freeze()
