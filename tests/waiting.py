"""The tests' one way to wait: poll a positive signal until it holds, with a generous failure guard.

``await eventually(condition, what="...")`` inside a coroutine, ``eventually_sync(condition,
what="...")`` in blocking code (the end-to-end tests drive processes from plain functions). Both
return as soon as ``condition()`` is truthy, with that value, so the timeout only bounds a failure
and may be long: a slow machine waits longer, a fast one no longer than it needs. On a timeout they
fail naming ``what`` and the last value ``condition()`` returned (or the last exception it raised,
when ``ignoring`` lets that exception mean "not yet").
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar, cast

T = TypeVar("T")

TIMEOUT = 60.0
"""Seconds before a wait fails by default: a guard against a hang, not the time a wait takes."""

INTERVAL = 0.01
"""Seconds between two polls by default."""

Abandon = Callable[[], "str | None"]


class _NotYet:
    """What a wait has seen before its first poll returned or raised."""

    def __repr__(self) -> str:
        return "nothing (never polled)"


def _described(condition: Callable[[], object], what: str | None) -> str:
    """``what``, or else the condition's source text (a lambda's line), so a failure still says what it awaited."""
    if what:
        return what
    try:
        return " ".join(inspect.getsource(condition).split())
    except (OSError, TypeError):
        return repr(condition)


def _fail(condition: Callable[[], object], what: str | None, timeout: float, last: object,
          details: Callable[[], str] | None) -> AssertionError:
    told = f"\n{details()}" if details is not None else ""
    return AssertionError(f"timed out after {timeout:g} s waiting for {_described(condition, what)}; "
                          f"last seen: {last!r}{told}")


def _abandoned(condition: Callable[[], object], what: str | None, unless: Abandon | None) -> AssertionError | None:
    reason = unless() if unless is not None else None
    return AssertionError(f"gave up waiting for {_described(condition, what)}: {reason}") if reason else None


async def eventually(condition: Callable[[], T | Awaitable[T]], *, what: str | None = None,
                     timeout: float = TIMEOUT,  # noqa: ASYNC109 - a failure guard of a poll, not a call's timeout
                     interval: float = INTERVAL, ignoring: tuple[type[Exception], ...] = (),
                     unless: Abandon | None = None, details: Callable[[], str] | None = None) -> T:
    """Await until ``condition()`` (a plain or an async callable) returns a truthy value; returns it.

    ``timeout`` and ``interval`` are seconds (real time, the event loop's sleep between polls).
    ``ignoring`` lists exceptions of ``condition()`` that mean "not yet" (a server not yet
    listening). ``unless()``, asked after each unmet poll, returns a reason to stop at once (a process
    exited) or ``None``. Raises :class:`AssertionError` naming ``what`` (by default the
    condition's source text) and the last value seen, then ``details()`` (a log's tail) when given,
    on the timeout; or ``unless``'s reason.
    """
    __tracebackhide__ = True
    deadline = time.monotonic() + timeout
    last: object = _NotYet()
    while True:
        try:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as error:
            last = error
        else:
            if value:
                return cast(T, value)
            last = value
        if (given_up := _abandoned(condition, what, unless)) is not None:
            raise given_up
        if time.monotonic() > deadline:
            raise _fail(condition, what, timeout, last, details)
        await asyncio.sleep(interval)


def eventually_sync(condition: Callable[[], T], *, what: str | None = None, timeout: float = TIMEOUT,
                    interval: float = INTERVAL, ignoring: tuple[type[Exception], ...] = (),
                    unless: Abandon | None = None, details: Callable[[], str] | None = None) -> T:
    """Block until ``condition()`` returns a truthy value; returns it. The arguments and the
    failure are :func:`eventually`'s; between polls the thread sleeps (blocking code only, never
    inside a coroutine)."""
    __tracebackhide__ = True
    deadline = time.monotonic() + timeout
    last: object = _NotYet()
    while True:
        try:
            value = condition()
        except ignoring as error:
            last = error
        else:
            if value:
                return value
            last = value
        if (given_up := _abandoned(condition, what, unless)) is not None:
            raise given_up
        if time.monotonic() > deadline:
            raise _fail(condition, what, timeout, last, details)
        time.sleep(interval)


def exited(process: subprocess.Popen[bytes] | subprocess.Popen[str], log: Path | None = None) -> Abandon:
    """An ``unless`` for :func:`eventually`: a reason once ``process`` has exited (its return code,
    then ``log``'s text or what it wrote to a piped stderr), ``None`` while it runs."""

    def reason() -> str | None:
        if process.poll() is None:
            return None
        if log is not None:
            output: str | bytes = log.read_text() if log.exists() else ""
        else:
            output = process.stderr.read() if process.stderr is not None else ""
        text = output.decode(errors="replace") if isinstance(output, bytes) else output
        return f"the process exited {process.returncode}:\n{text}"

    return reason
