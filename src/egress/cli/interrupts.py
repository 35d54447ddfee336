"""Ctrl-C and SIGTERM of one ``egress run``: the first stops the run after its current epoch
commits; any later one exits at once with 130, wherever it lands.

While the run's event loop runs, :meth:`Interrupts.during_the_run` is the loop's signal handler.
The loop takes its handlers away when it closes, and after it the exit still has work: the
summary, the report file, ``settle_for_exit``'s collection, finalizers. A second Ctrl-C there met
Python's default handler and printed a ``KeyboardInterrupt`` traceback (from inside the collector,
as "Exception ignored in ..."), so :meth:`Interrupts.after_the_loop` installs a process handler
that says so and ends the process at once instead.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

from egress.cli.output import Output

SIGNALS = (signal.SIGINT, signal.SIGTERM)
INTERRUPTED = 130


class Interrupts:
    """The interrupts of one run; ``stop`` asks the run to stop after its current epoch commits
    (``Pipeline.request_stop``); ``finished`` is set once the run has returned (its final commit
    made)."""

    def __init__(self, output: Output, stop: Callable[[], None]) -> None:
        self._output = output
        self._stop = stop
        self.count = 0
        self.finished = False

    def during_the_run(self) -> None:
        """The event loop's handler: stop the run at the first, exit at once at a later one."""
        self.count += 1
        if self.count > 1:
            self._say()
            sys.exit(INTERRUPTED)  # unwinds through the loop: the process has not begun to exit yet
        self._output.say("stopping after the current epoch commits (Ctrl-C again to exit at once)")
        self._stop()

    def after_the_loop(self) -> None:
        """Handle every later Ctrl-C and SIGTERM of the process by :meth:`exit_at_once` (call it
        once the loop has closed, which restored Python's own handlers)."""
        for signum in SIGNALS:
            signal.signal(signum, self._handler)

    def exit_at_once(self) -> NoReturn:
        """Count one more interrupt, say why and end the process with 130 now. ``os._exit``, not
        ``SystemExit``: the handler may run inside a finalizer or the garbage collector, where an
        exception is printed and ignored, and the exit's own work is what the interrupt cuts short."""
        self.count += 1
        self._say()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(INTERRUPTED)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.exit_at_once()

    def _say(self) -> None:
        which = "second interrupt" if self.count > 1 else "interrupt"
        then = "; the final commit is made" if self.finished else " without the final commit"
        self._output.say(f"{which}: exiting at once{then}", level=logging.WARNING)
