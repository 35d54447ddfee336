"""The restart horizon: a time, written ahead to a small file, after which no quota a controller has
released may still be used, so that the controller, restarted, knows where its bucket stands.

A restarted controller cannot know what its predecessor released just before it stopped, nor which
leased quota clients still hold. If the file says ``horizon`` (seconds since the Unix epoch, wall
clock: it must mean the same across processes), every release bucket starts empty at that time:
whatever the predecessor released, and whenever its clients used it, the envelope holds across the
restart. The controller writes a horizon ``SLACK`` seconds beyond every lease it grants before the
client can see the grant, so the file is written at most about once per ``SLACK`` seconds.

A missing file is a first start (buckets start full). A file that cannot be read or parsed is
treated as a restart whose horizon is unknown: the caller closes its buckets for one lease.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson

from egress.clock import Clock

log = logging.getLogger("egress.throttler.horizon")

SLACK = 1.0
"""Seconds written beyond the latest lease end, so that the file is not rewritten for every grant."""


class HorizonFile:
    """The restart horizon of one controller in ``path`` (JSON ``{"horizon": unix seconds}``).

    Times passed in and returned are ``clock.monotonic()`` seconds; the file holds wall-clock time.
    """

    def __init__(self, path: str | Path, clock: Clock) -> None:
        self.path = Path(path)
        self.clock = clock
        self._written = -float("inf")  # monotonic horizon last written

    def load(self) -> float | None:
        """The predecessor's horizon (monotonic seconds), ``None`` when the file does not exist.

        Raises :class:`ValueError` naming the file when it exists but cannot be read or parsed.
        """
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise ValueError(f"{self.path}: cannot read the throttler restart horizon: {error}") from None
        try:
            horizon = float(orjson.loads(text)["horizon"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f'{self.path}: expected {{"horizon": <unix seconds>}}, got {text[:80]!r} ({error}); '
                             "delete the file only if no controller or client used it in the last period") from None
        return self.clock.monotonic() + (horizon - self.clock.now())

    def cover(self, until: float) -> None:
        """Make sure the file says ``until`` (monotonic seconds) or later; writes ``until + SLACK``.

        Call before a grant that may be used until ``until`` becomes visible. A failed write is
        logged (the grant goes ahead: availability first) and retried on the next grant.
        """
        if until <= self._written:
            return
        horizon = until + SLACK
        wall = self.clock.now() + (horizon - self.clock.monotonic())
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            temporary.write_bytes(orjson.dumps({"horizon": wall}))
            os.replace(temporary, self.path)
        except OSError as error:
            log.error("cannot write the throttler restart horizon %s: %s (a restart may let one extra burst "
                      "through)", self.path, error)
            return
        self._written = horizon
