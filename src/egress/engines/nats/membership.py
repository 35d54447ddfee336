"""``Membership`` on NATS: a member is a KV entry ``member.<worker id>`` with a per-message TTL;
:meth:`NatsMembership.on_members` tells of registrations and departures as they are published."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from egress.engines.nats import records
from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.errors import NatsEngineError, NatsUnavailableError
from egress.engines.nats.jetstream import TOMBSTONE, Outgoing, is_deleted, ttl_headers
from egress.engines.protocols import MemberCallback, MemberInfo

logger = logging.getLogger(__name__)


class NatsMembership(NatsConnection):
    """:class:`~egress.engines.protocols.Membership` in the bucket, and
    :class:`~egress.engines.protocols.MemberNotices` from a core NATS subscription to its member
    subjects (a registration is a JetStream publish on ``member.<worker id>``, which core
    subscribers of that subject receive too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._member_callbacks: list[MemberCallback] = []
        self._member_subscription: Subscription | None = None
        self._member_subscribing: asyncio.Task[None] | None = None

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
        self._member_callbacks.append(callback)
        if self._connection is not None and self._member_subscription is None and self._member_subscribing is None:
            self._member_subscribing = asyncio.get_running_loop().create_task(self._subscribe_members())
            self._member_subscribing.add_done_callback(self._members_subscribed)

    async def _opened(self) -> None:
        await super()._opened()
        if self._member_callbacks:
            await self._subscribe_members()

    async def close(self) -> None:
        subscribing, self._member_subscribing = self._member_subscribing, None
        if subscribing is not None:
            subscribing.cancel()
            with contextlib.suppress(asyncio.CancelledError, NatsEngineError, NatsUnavailableError):
                await subscribing
        self._member_subscription = None  # closing the connection ends it
        await super().close()

    def _members_subscribed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.warning("NATS %s: no member notices: %s", self.url, task.exception())
            self._member_subscribing = None  # the next registration tries again

    async def _subscribe_members(self) -> None:
        connection = self._connection
        if connection is None or self._member_subscription is not None:
            return

        async def on_member(message: Msg) -> None:
            worker_id: str | None = None
            if message.data:
                try:
                    worker_id = records.member_info(message.data).worker_id
                except (ValueError, TypeError, KeyError) as error:
                    logger.warning("NATS %s: %s: an unreadable member record: %s", self.url, message.subject, error)
                    return
            for callback in list(self._member_callbacks):
                try:
                    callback(worker_id)
                except Exception:  # one callback's failure must not end the notices
                    logger.exception("an on_members callback failed")

        async with self._js().answering("the subscription to member notices"):
            self._member_subscription = await connection.subscribe(self._layout.members(), cb=on_member)
            await connection.flush(timeout=max(1, round(self.request_timeout)))
