"""Append notifications of a shared engine: which log partitions other processes appended to."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from egress.engines.protocols import AppendsCallback
from egress.engines.sqlite.log import SqliteLog

APPENDS_POLL_INTERVAL = 0.05
"""Seconds between two ``PRAGMA data_version`` looks of a shared engine with an appends callback."""

logger = logging.getLogger(__name__)


class SqliteAppends(SqliteLog):
    """:meth:`on_appends` of an engine: only a shared one has other processes' appends to tell."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._appends_callbacks: list[AppendsCallback] = []
        self._appends_watch: _AppendsWatch | None = None
        self._appends_poller: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await super().open()
        if self._appends_callbacks:
            self._start_appends_poller()

    async def close(self) -> None:
        poller, self._appends_poller = self._appends_poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        await super().close()

    def on_appends(self, callback: AppendsCallback) -> None:
        """Call ``callback`` with the ``(stream, partition)`` slots other processes appended to.
        Only a shared engine has other processes' appends to tell: it then looks every
        :data:`APPENDS_POLL_INTERVAL` seconds whether the database changed (``PRAGMA data_version``,
        which changes with another connection's commit), and if so which log partitions grew.
        Unshared, a no-op."""
        if not self.shared:
            return
        self._appends_callbacks.append(callback)
        if self._db is not None:
            self._start_appends_poller()

    def _start_appends_poller(self) -> None:
        if self._appends_poller is None:
            self._appends_poller = asyncio.get_running_loop().create_task(self._poll_appends())

    async def _poll_appends(self) -> None:
        while True:
            grown = await self._read_call(self._grown_sync)
            if grown:
                for callback in list(self._appends_callbacks):
                    try:
                        callback(grown)
                    except Exception:  # one callback's failure must not end the notifications
                        logger.exception("an on_appends callback failed")
            await self._clock.sleep(APPENDS_POLL_INTERVAL)

    def _grown_sync(self) -> set[tuple[str, int]]:
        """The log partitions other processes appended to since the last look."""
        db = self._db
        assert db is not None
        (version,) = db.execute("PRAGMA data_version").fetchone()
        watch = self._appends_watch
        if watch is None:
            self._appends_watch = _AppendsWatch(int(version), self._log_ends_sync())
            return set()
        grown, watch.grown = watch.grown, set()
        if int(version) != watch.data_version:
            watch.data_version = int(version)
            ends = self._log_ends_sync()
            grown |= {slot for slot, end in ends.items() if end > watch.ends.get(slot, 0)}
            watch.ends = ends
        return grown


class _AppendsWatch:
    """What a shared engine's appends poller last saw: the database's ``data_version``, the log
    ends, and slots other processes grew that this process's own appends since then covered."""

    def __init__(self, data_version: int, ends: dict[tuple[str, int], int]) -> None:
        self.data_version = data_version
        self.ends = ends
        self.grown: set[tuple[str, int]] = set()

    def own(self, starts: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]) -> None:
        """Count this process's appends (``starts`` → ``ends`` per slot) as seen; a slot that had
        grown beyond what was last seen before them is another process's too."""
        for slot, start in starts.items():
            if start > self.ends.get(slot, 0):
                self.grown.add(slot)
            self.ends[slot] = ends[slot]

