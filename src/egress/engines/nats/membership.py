"""``Membership`` on NATS: a member is a KV entry ``member.<worker id>`` with a per-message TTL;
:meth:`NatsMembership.on_members` tells of registrations and departures as they are published."""

from __future__ import annotations

import logging
from typing import Any

from nats.aio.msg import Msg

from egress.engines.nats import records
from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.jetstream import TOMBSTONE, Outgoing, is_deleted, ttl_headers
from egress.engines.nats.notices import SKIP, CoreNotices
from egress.engines.protocols import MemberCallback, MemberInfo

logger = logging.getLogger(__name__)


class NatsMembership(NatsConnection):
    """:class:`~egress.engines.protocols.Membership` in the bucket, and
    :class:`~egress.engines.protocols.MemberNotices` from a core NATS subscription to its member
    subjects (a registration is a JetStream publish on ``member.<worker id>``, which core
    subscribers of that subject receive too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._member_notices: CoreNotices[str | None] = CoreNotices(
            self, "member notices", lambda: self._layout.members(), self._member_of)

    async def register(self, member: MemberInfo, ttl: float) -> None:
        """Write ``member.<worker id>`` with ``Nats-TTL`` (``ttl`` rounded up to whole seconds); the
        server removes it within a second of that unless a later register replaced it.
        ``details`` must be JSON-serialisable."""
        await self._js().publish(Outgoing(self._layout.member(member.worker_id), records.member_record(member),
                                          ttl_headers(ttl)))

    async def deregister(self, worker_id: str) -> None:
        """Delete ``member.<worker id>``: a KV delete marker with ``Nats-TTL`` 1 s, so a worker id
        used once (``host-pid``) leaves nothing behind. What the marker replaced lapses by its own
        TTL, also if a SIGKILL of the server brings it back."""
        await self._js().publish(Outgoing(self._layout.member(worker_id), b"", {**TOMBSTONE, **ttl_headers(1)}))

    async def members(self) -> list[MemberInfo]:
        found = [records.member_info(stored.data)
                 for stored in await self._js().scan(self._layout.members()) if not is_deleted(stored)]
        return sorted(found, key=lambda member: member.worker_id)

    # -- notices -------------------------------------------------------------------------------

    def on_members(self, callback: MemberCallback) -> None:
        """Call ``callback(worker_id)`` for every registration published on the bucket's member
        subjects, ``callback(None)`` for a deregistration (its delete marker has no body). Core
        NATS: at most once (nothing while the connection is down; the client subscribes again
        when it reconnects); a member that lapses by its TTL sends nothing. Subscribed once a
        callback is registered (at ``open()`` if not yet open)."""
        self._member_notices.add(callback)

    async def _opened(self) -> None:
        await super()._opened()
        await self._member_notices.opened()

    async def close(self) -> None:
        await self._member_notices.close()
        await super().close()

    def _member_of(self, message: Msg) -> str | object | None:
        """The worker id a member notice names (``None``: a departure), or ``SKIP`` if unreadable."""
        if not message.data:
            return None
        try:
            return records.member_info(message.data).worker_id
        except (ValueError, TypeError, KeyError) as error:
            logger.warning("NATS %s: %s: an unreadable member record: %s", self.url, message.subject, error)
            return SKIP
