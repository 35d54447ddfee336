"""Log retention on NATS: the log chunks every consumer has passed are purged."""

from __future__ import annotations

from typing import Any

from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.jetstream import is_deleted
from egress.engines.nats.records import CheckpointRecord
from egress.engines.nats.subjects import name_of_token
from egress.engines.protocols import ROLE_PREFIX


class NatsRetention(NatsConnection):
    """:meth:`trim`, which a commit runs every ``retention_period`` seconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trimmed: dict[tuple[str, int], int] = {}
        self._last_trim = float("-inf")
        self._trimming = False

    async def trim(self) -> None:
        """Purge, per log partition, the chunks before the one holding the lowest committed position of any
        consumer (the last chunk always stays: it holds the end offset). No log chunk is purged
        while a consumer holds a lease without having committed, its inputs being unknown (a role's
        lease, ``ROLE_PREFIX``, does not count: its holder reads no log)."""
        self._trimming = True
        try:
            self._last_trim = self._clock.monotonic()
            js, layout = self._js(), self._layout
            checkpoints = await js.scan(layout.checkpoints())
            committed = {layout.suffix(s.subject).split(".", 1)[1] for s in checkpoints}
            leased = {key for s in await js.scan(layout.leases())
                      if not is_deleted(s) and not _is_role(key := layout.suffix(s.subject).split(".", 1)[1])}
            if leased - committed:
                return
            lowest: dict[tuple[str, int], tuple[int, int]] = {}
            for stored in checkpoints:
                for slot, (offset, hint) in CheckpointRecord.decode(stored.data).positions.items():
                    if slot[0] and (slot not in lowest or (offset, hint) < lowest[slot]):
                        lowest[slot] = (offset, hint)
            for slot, (_, hint) in lowest.items():
                if hint > self._trimmed.get(slot, 0):
                    await js.purge(layout.log_chunks(*slot), hint)
                    if getattr(self, "traced_log", False):  # the contexts of the chunks purged (traces.py)
                        await js.purge(layout.log_traces(*slot), hint)
                    self._trimmed[slot] = hint
        finally:
            self._trimming = False


def _is_role(lease_key: str) -> bool:
    """Whether a lease key ``<consumer token>.<partition>`` is a role's (``ROLE_PREFIX``): its holder
    commits nothing, so retention does not wait for it."""
    return name_of_token(lease_key.split(".", 1)[0]).startswith(ROLE_PREFIX)
