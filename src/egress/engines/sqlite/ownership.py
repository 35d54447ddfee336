"""``Ownership`` on SQLite: the ``ownership`` table holds each unit's lease generation (in its column
``epoch``, the name stored directories have), the ``leases`` table its owner and expiry."""

from __future__ import annotations

import math

from egress.engines.protocols import LeaseInfo
from egress.engines.sqlite.connection import SqliteConnection

_RELEASED = -math.inf
"""``leases.expires_at`` of a released lease: lapsed whatever the clock says."""


class SqliteOwnership(SqliteConnection):
    """:class:`~egress.engines.protocols.Ownership` of the connection's database, the TTLs on the
    engine's clock (wall-clock seconds, so that processes sharing the database agree)."""

    async def acquire(self, consumer: str, partition: int) -> int:
        return await self._call(self._acquire_sync, consumer, partition)

    def _acquire_sync(self, consumer: str, partition: int) -> int:
        assert self._db is not None
        with self._transaction():
            generation = self._next_generation_sync(consumer, partition)
            self._write_lease_sync(consumer, partition, "", None)
        return generation

    def _next_generation_sync(self, consumer: str, partition: int) -> int:
        """Raise the generation of ``(consumer, partition)`` (inside a write transaction) and return it."""
        assert self._db is not None
        self._db.execute(
            "INSERT INTO ownership (consumer, partition, epoch) VALUES (?, ?, 1) "
            "ON CONFLICT (consumer, partition) DO UPDATE SET epoch = epoch + 1",
            (consumer, partition),
        )
        (generation,) = self._db.execute(
            "SELECT epoch FROM ownership WHERE consumer = ? AND partition = ?", (consumer, partition)
        ).fetchone()
        return int(generation)

    def _write_lease_sync(self, consumer: str, partition: int, owner: str, expires_at: float | None) -> None:
        assert self._db is not None
        self._db.execute(
            "INSERT INTO leases (consumer, partition, owner, expires_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at",
            (consumer, partition, owner, expires_at),
        )

    def _held_sync(self, consumer: str, partition: int) -> tuple[int, str, float | None] | None:
        """``(generation, owner, expires_at)`` of the live lease of ``(consumer, partition)``, ``None``
        when it is lapsed, released or was never taken. Directories of earlier versions have
        generations without a lease row: those never lapse, like :meth:`acquire`'s."""
        assert self._db is not None
        row = self._db.execute(
            "SELECT o.epoch, l.owner, l.expires_at, l.consumer IS NOT NULL FROM ownership o LEFT JOIN leases l "
            "ON l.consumer = o.consumer AND l.partition = o.partition WHERE o.consumer = ? AND o.partition = ?",
            (consumer, partition),
        ).fetchone()
        if row is None:
            return None
        generation, owner, expires_at, has_lease = row
        if has_lease and expires_at is not None and float(expires_at) <= self._clock.now():
            return None
        return int(generation), str(owner or ""), None if expires_at is None else float(expires_at)

    async def try_acquire(self, consumer: str, partition: int, owner: str, ttl: float) -> int | None:
        """Take the lease of ``(consumer, partition)`` for ``owner`` until ``ttl`` seconds from now
        on the engine's clock, unless another owner's lease is live (then ``None``). A lease taken
        by :meth:`acquire` names no owner and never lapses: this takes it over (it was a
        single-process run's, which holds the state directory's lock while it runs)."""
        return await self._call(self._try_acquire_sync, consumer, partition, owner, ttl)

    def _try_acquire_sync(self, consumer: str, partition: int, owner: str, ttl: float) -> int | None:
        with self._transaction():
            held = self._held_sync(consumer, partition)
            if held is not None and held[1] not in ("", owner):
                return None
            generation = self._next_generation_sync(consumer, partition)
            self._write_lease_sync(consumer, partition, owner, self._clock.now() + ttl)
        return generation

    async def renew(self, consumer: str, partition: int, generation: int, ttl: float) -> bool:
        """Make the lease held at ``generation`` lapse ``ttl`` seconds from now; ``False`` when it is not
        held at ``generation`` (lapsed, released or taken). Runs on the engine's one thread, between
        commits, so it never fails one."""
        return await self._call(self._renew_sync, consumer, partition, generation, ttl)

    def _renew_sync(self, consumer: str, partition: int, generation: int, ttl: float) -> bool:
        assert self._db is not None
        with self._transaction():
            held = self._held_sync(consumer, partition)
            if held is None or held[0] != generation:
                return False
            self._write_lease_sync(consumer, partition, held[1], self._clock.now() + ttl)
        return True

    async def release(self, consumer: str, partition: int, generation: int) -> None:
        """Let the lease held at ``generation`` lapse now (a no-op when it is not held at ``generation``):
        another owner may take it at once, and commits of ``generation`` are fenced."""
        await self._call(self._release_sync, consumer, partition, generation)

    def _release_sync(self, consumer: str, partition: int, generation: int) -> None:
        with self._transaction():
            held = self._held_sync(consumer, partition)
            if held is not None and held[0] == generation:
                self._write_lease_sync(consumer, partition, held[1], _RELEASED)

    async def leases(self) -> list[LeaseInfo]:
        """The live leases (those :meth:`acquire` took included, with ``expires_in=None``), sorted
        by ``(consumer, partition)``."""
        return await self._call(self._leases_sync)

    def _leases_sync(self) -> list[LeaseInfo]:
        assert self._db is not None
        now = self._clock.now()
        rows = self._db.execute(
            "SELECT o.consumer, o.partition, l.owner, o.epoch, l.expires_at FROM ownership o LEFT JOIN leases l "
            "ON l.consumer = o.consumer AND l.partition = o.partition "
            "WHERE l.expires_at IS NULL OR l.expires_at > ? ORDER BY o.consumer, o.partition", (now,)).fetchall()
        return [LeaseInfo(str(c), int(p), str(owner or ""), int(generation), None if at is None else float(at) - now)
                for c, p, owner, generation, at in rows]
