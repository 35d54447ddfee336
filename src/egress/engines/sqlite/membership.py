"""``Membership`` on SQLite: the ``members`` table, each row listed until its ``expires_at``."""

from __future__ import annotations

import json

from egress.engines.protocols import MemberInfo
from egress.engines.sqlite.connection import SqliteConnection


class SqliteMembership(SqliteConnection):
    """:class:`~egress.engines.protocols.Membership` of the connection's database, the TTLs on the
    engine's clock."""

    async def register(self, member: MemberInfo, ttl: float) -> None:
        """List ``member`` until ``ttl`` seconds from now on the engine's clock (replacing what its
        worker id registered before). ``details`` must be JSON-serialisable."""
        await self._call(self._register_sync, member, ttl)

    def _register_sync(self, member: MemberInfo, ttl: float) -> None:
        assert self._db is not None
        details = json.dumps(member.details, sort_keys=True)
        now = self._clock.now()
        with self._transaction():
            self._db.execute("DELETE FROM members WHERE expires_at <= ?", (now,))
            self._db.execute(
                "INSERT INTO members (worker_id, spec_digest, details, expires_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT DO UPDATE SET spec_digest = excluded.spec_digest, details = excluded.details, "
                "expires_at = excluded.expires_at", (member.worker_id, member.spec_digest, details, now + ttl))

    async def deregister(self, worker_id: str) -> None:
        await self._call(self._deregister_sync, worker_id)

    def _deregister_sync(self, worker_id: str) -> None:
        assert self._db is not None
        with self._transaction():
            self._db.execute("DELETE FROM members WHERE worker_id = ?", (worker_id,))

    async def members(self) -> list[MemberInfo]:
        return await self._call(self._members_sync)

    def _members_sync(self) -> list[MemberInfo]:
        assert self._db is not None
        rows = self._db.execute("SELECT worker_id, spec_digest, details FROM members WHERE expires_at > ? "
                                "ORDER BY worker_id", (self._clock.now(),)).fetchall()
        return [MemberInfo(str(w), str(d), json.loads(details)) for w, d, details in rows]
