"""``Membership`` on NATS: a member is a KV entry ``member.<worker id>`` with a per-message TTL."""

from __future__ import annotations

from egress.engines.nats import records
from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.jetstream import TOMBSTONE, Outgoing, is_deleted, ttl_headers
from egress.engines.protocols import MemberInfo


class NatsMembership(NatsConnection):
    """:class:`~egress.engines.protocols.Membership` in the bucket."""

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
