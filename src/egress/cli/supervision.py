"""A child of ``egress run --processes N`` ends with its supervisor.

The supervisor starts its workers and its ``egress throttler serve`` in sessions of their own (so a
Ctrl-C at the terminal reaches them once, through it). Killed itself (``kill -9``, the OOM killer),
it cannot stop them: they ran on under init, beside the workers of the next run, and their
throttler service with them, so the next run's rate limit was exceeded. Each child therefore asks
Linux to send it ``SIGTERM`` when its parent ends (``prctl(PR_SET_PDEATHSIG)``): a worker then
stops as at a Ctrl-C (after the message in hand, committing what it processed), the service stops
serving. Elsewhere than Linux nothing is asked.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
"""``prctl``'s option: the signal sent to this process when its parent ends (linux/prctl.h)."""


def end_with(supervisor: int) -> None:
    """Have this process sent ``SIGTERM`` once ``supervisor`` (its parent's pid) ends; sent at once
    when it already has (it ended before this process could ask). Raises ``OSError`` when Linux
    refuses."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    if os.getppid() != supervisor:  # reparented already: the supervisor ended before the prctl
        os.kill(os.getpid(), signal.SIGTERM)
