"""Ctrl-C and SIGTERM of one ``egress run``: the first stops the run once the process function's
call in hand returns, committing what each epoch processed; any later one exits at once with 130,
wherever it lands.

While the run's event loop runs, :meth:`Interrupts.during_the_run` installs the process's signal
handlers. They are Python's, not the loop's (``loop.add_signal_handler`` runs a handler only when the
loop turns): a process function that blocks the loop (a ``time.sleep``, a slow synchronous call) for
an epoch's rows would otherwise leave Ctrl-C unanswered, the first and the second. Python runs its
handlers in the main thread between two bytecodes of whatever runs there, so the first says that
the run stops, sets the flags that make each epoch call the function for nothing more
(``interrupt``: ``Pipeline.interrupt``, plain flags, which the epoch reads between two calls even
while the function keeps the loop from turning) and asks the loop (``call_soon_threadsafe``) to stop
the run; a later one exits at once.
When the loop has closed, the exit still has work: the
summary, the report file, ``settle_for_exit``'s collection, finalizers. A second Ctrl-C there met
Python's default handler and printed a ``KeyboardInterrupt`` traceback (from inside the collector,
as "Exception ignored in ..."), so :meth:`Interrupts.after_the_loop` installs a process handler
that says so and ends the process at once instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

from egress.cli.exit_codes import INTERRUPTED
from egress.cli.output import Output

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """The interrupts of one run; ``interrupt`` (called in the signal handler: plain flags only,
    ``Pipeline.interrupt``) makes every epoch call the process function for nothing more, ``stop``
    (called on the loop, ``Pipeline.request_stop``) stops the run once they committed what they
    processed; ``finished`` is set once the run has returned (its final commit made). With
    ``announce`` False (a worker process of ``--processes``, whose supervisor tells the terminal
    once for every worker) nothing is said."""

    def __init__(self, output: Output, stop: Callable[[], None], interrupt: Callable[[], None], *,
                 announce: bool = True) -> None:
        self._output = output
        self._stop = stop
        self._interrupt = interrupt
        self._announce = announce  # False in a worker of --processes: its supervisor says it once for all
        self.count = 0
        self.finished = False

    def during_the_run(self, loop: asyncio.AbstractEventLoop) -> None:
        """Handle Ctrl-C and SIGTERM while ``loop`` runs the run: the first calls ``interrupt`` at
        once and ``stop`` on ``loop``, a later one :meth:`exit_at_once`."""
        def say_and_stop(line: str) -> None:
            self._output.say(line)
            self._stop()

        def handler(signum: int, frame: FrameType | None) -> None:
            if self.count:
                self.exit_at_once(frame)
            self.count += 1
            self._interrupt()  # now: the loop may be blocked by the function until the epoch ends
            if not self._announce:
                loop.call_soon_threadsafe(self._stop)
            elif printing(frame):  # the loop turns (it prints): say it there, not inside the print
                loop.call_soon_threadsafe(say_and_stop, stopping_line(signum))
            else:
                self._output.say(stopping_line(signum))  # the loop may be blocked (a process function): say it now
                loop.call_soon_threadsafe(self._stop)

        for signum in SIGNALS:
            signal.signal(signum, handler)

    def after_the_loop(self) -> None:
        """Handle every later Ctrl-C and SIGTERM of the process by :meth:`exit_at_once` (call it
        once the loop has closed, which restored Python's own handlers)."""
        for signum in SIGNALS:
            signal.signal(signum, self._handler)

    def exit_at_once(self, frame: FrameType | None = None) -> NoReturn:
        """Count one more interrupt, say why and end the process with 130 now. ``os._exit``, not
        ``SystemExit``: the handler may run inside a finalizer or the garbage collector, where an
        exception is printed and ignored, and the exit's own work is what the interrupt cuts short.
        ``frame``: where the signal landed; inside a print, the line is written to stderr's file
        descriptor directly, as the console would write its half-done line again."""
        self.count += 1
        which = "second interrupt" if self.count > 1 else "interrupt"
        then = "; the final commit is made" if self.finished else " without the final commit"
        if self._announce:
            if printing(frame):
                os.write(sys.stderr.fileno(), f"{which}: exiting at once{then}\n".encode())
            else:
                self._output.say(f"{which}: exiting at once{then}", level=logging.WARNING)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(INTERRUPTED)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.exit_at_once(frame)


def again(signum: int) -> str:
    """What exits at once after the first ``signum`` asked the run to stop."""
    return "Ctrl-C again" if signum == signal.SIGINT else "SIGTERM again, or Ctrl-C,"


def stopping_line(signum: int) -> str:
    """What the first Ctrl-C (``SIGINT``) or ``SIGTERM`` of a run says."""
    return f"stopping after the message in hand; what was processed is committed ({again(signum)} to exit at once)"


PRINTING_MODULES = ("rich", "logging", "egress.cli.output")
"""Modules whose frames mean a signal landed inside a print: Python runs a handler between two
bytecodes of whatever the main thread runs, and a print from the handler there would write the
console's unflushed line again (rich keeps it in a buffer until the outer print ends)."""


def printing(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a caller of it runs in one of :data:`PRINTING_MODULES`."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if any(name == module or name.startswith(f"{module}.") for module in PRINTING_MODULES):
            return True
        frame = frame.f_back
    return False
