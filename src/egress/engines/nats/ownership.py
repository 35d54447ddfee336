"""``Ownership`` on NATS: a lease is a KV entry ``lease.<consumer>.<partition>``, its revision the
fence; the revision that took it is its generation."""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass
from typing import Any

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from egress.engines.nats import records
from egress.engines.nats.connection import NatsConnection
from egress.engines.nats.errors import JetStreamRequestError, NatsEngineError
from egress.engines.nats.jetstream import TOMBSTONE, WRONG_LAST_SEQUENCE, Outgoing, expect_last, is_deleted, ttl_headers
from egress.engines.nats.locks import locked
from egress.engines.protocols import FencedError, LeaseInfo

_ACQUIRE_ATTEMPTS = 20


@dataclass(slots=True)
class _Lease:
    """A lease this engine took: the revision that took it (its generation), its latest revision (what
    commits expect: renewals move it) and the worker it names (``""`` for :meth:`acquire`'s)."""

    generation: int
    revision: int
    worker: str = ""



class NatsOwnership(NatsConnection):
    """:class:`~egress.engines.protocols.Ownership` in the bucket. Renewals, releases and commits of
    one lease take its lock in ``_consumer_locks``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._leases: dict[tuple[str, int], _Lease] = {}
        self._consumer_locks: dict[tuple[str, int], asyncio.Lock] = {}

    async def acquire(self, consumer: str, partition: int) -> int:
        """Take the lease of ``(consumer, partition)`` (a KV update expecting its last revision) and
        return its new revision, the generation. The lease records this engine's ``owner`` and
        ``lease_ttl``; the take-over is unconditional (renewal and expiry come with balancing)."""
        kv = self._kv
        if kv is None:
            raise NatsEngineError(f"{self.url}: the engine is not open; call open() first")
        key = self._layout.lease_key(consumer, partition)
        lease = json.dumps({"consumer": consumer, "partition": partition, "owner": self.owner,
                            "ttl": self.lease_ttl, "acquired_at": self._clock.now()}).encode()
        js, what = self._js(), f"the lease of {consumer} partition {partition}"
        for _ in range(_ACQUIRE_ATTEMPTS):
            async with js.answering(what):
                try:
                    last = (await js.retrying(what, lambda: kv.get(key))).revision
                except KeyNotFoundError as missing:
                    last = missing.entry.revision if missing.entry is not None else 0
                try:
                    revision = await js.retrying(what, functools.partial(kv.update, key, lease, last=last))
                except KeyWrongLastSequenceError:
                    continue  # another process took it between the read and the update (or an answer was lost)
            js.observed(revision)
            self._leases[(consumer, partition)] = _Lease(revision, revision)
            return revision
        raise NatsEngineError(f"{self.url}: bucket {self.bucket}: the lease of {consumer} partition {partition} "
                              f"changed under every one of {_ACQUIRE_ATTEMPTS} attempts to take it")

    def _fence(self, consumer: str, partition: int, generation: int) -> int:
        """The lease revision a commit of ``generation`` expects: its latest renewal's, or the generation itself."""
        lease = self._leases.get((consumer, partition))
        return lease.revision if lease is not None and lease.generation == generation else generation

    async def try_acquire(self, consumer: str, partition: int, owner: str, ttl: float) -> int | None:
        """Take the lease of ``(consumer, partition)`` for worker ``owner``: a message on its subject
        with ``Nats-TTL`` (``ttl`` rounded up to whole seconds, the server's granularity), expecting
        the subject's last sequence as read, so of two takers one wins. Returns its revision, the
        generation; ``None`` while the subject holds another owner's lease (the server removes a lapsed
        one within a second of its TTL). A lease of :meth:`acquire` (no owner, no TTL) is taken over."""
        subject = self._layout.lease(consumer, partition)
        for _ in range(_ACQUIRE_ATTEMPTS):
            stored = await self._js().last(subject)
            holder = None if stored is None or is_deleted(stored) else json.loads(stored.data).get("worker", "")
            if holder not in (None, "", owner):
                return None
            record = self._lease_record(consumer, partition, owner, ttl)
            expected = expect_last(0 if stored is None else stored.seq, subject)
            revision = await self._publish_lease(Outgoing(subject, record, {**expected, **ttl_headers(ttl)}),
                                                 f"the lease of {consumer} partition {partition}")
            if revision is None:
                continue  # taken, released or lapsed between the read and the publish: read again
            self._leases[(consumer, partition)] = _Lease(revision, revision, owner)
            return revision
        raise NatsEngineError(f"{self.url}: bucket {self.bucket}: the lease of {consumer} partition {partition} "
                              f"changed under every one of {_ACQUIRE_ATTEMPTS} attempts to take it")

    def _lease_record(self, consumer: str, partition: int, worker: str, ttl: float,
                      generation: int | None = None) -> bytes:
        """The JSON of a lease (``records``' module docs); ``generation`` for a renewal, ``None`` when taking it."""
        now = self._clock.now()
        lease: dict[str, Any] = {"consumer": consumer, "partition": partition, "owner": self.owner, "ttl": ttl,
                                 "worker": worker, "expires_at": now + ttl}
        if generation is None:
            lease["acquired_at"] = now
        else:
            lease.update({records.LEASE_GENERATION: generation, "renewed_at": now})
        return json.dumps(lease).encode()

    async def renew(self, consumer: str, partition: int, generation: int, ttl: float) -> bool:
        """Replace the lease held at ``generation`` by one lapsing ``ttl`` seconds from now, expecting its
        current revision (which then becomes the fence of this generation's commits); ``False`` when the
        subject moved on (lapsed and removed by the server, released, or taken). Waits for a commit
        of the same lease in flight, which would otherwise meet the new revision."""
        async with locked(self._consumer_locks, [(consumer, partition)]):
            lease = await self._held(consumer, partition, generation)
            if lease is None:
                return False
            subject = self._layout.lease(consumer, partition)
            record = self._lease_record(consumer, partition, lease.worker, ttl, generation)
            revision = await self._publish_lease(
                Outgoing(subject, record, {**expect_last(lease.revision, subject), **ttl_headers(ttl)}),
                f"the renewal of the lease of {consumer} partition {partition}")
            if revision is None:
                return False
            lease.revision = revision
            known = self._leases.get((consumer, partition))
            if known is None or known.generation <= generation:  # not over a lease taken meanwhile
                self._leases[(consumer, partition)] = lease
            return True

    async def _held(self, consumer: str, partition: int, generation: int) -> _Lease | None:
        """The lease of ``(consumer, partition)`` as this engine took it at ``generation``, else as stored
        when it is held at ``generation`` (another engine instance took it), else ``None``."""
        lease = self._leases.get((consumer, partition))
        if lease is not None and lease.generation == generation:
            return lease
        stored = await self._js().last(self._layout.lease(consumer, partition))
        if stored is None or is_deleted(stored):
            return None
        info = records.lease_info(stored.data, stored.seq, self._clock.now())
        return _Lease(generation, stored.seq, info.owner) if info.generation == generation else None

    async def _publish_lease(self, message: Outgoing, what: str) -> int | None:
        """Publish a lease message; its revision, or ``None`` when the subject's last sequence is
        not the one it expects (the lease changed). When the subject's last message is this very
        record (a request sent again after its answer was lost: the server checks the expected
        sequence before duplicate message ids, measured on 2.15.1), that is its revision."""
        try:
            return await self._js().publish(message)
        except JetStreamRequestError as error:
            if error.code != WRONG_LAST_SEQUENCE:
                raise NatsEngineError(f"{self.url}: bucket {self.bucket}: {what} was refused: {error}") from None
        stored = await self._js().last(message.subject)
        if message.payload and stored is not None and not is_deleted(stored) and stored.data == message.payload:
            return stored.seq
        return None

    async def release(self, consumer: str, partition: int, generation: int) -> None:
        """Delete the lease held at ``generation`` (a KV delete marker expecting its current revision):
        another owner may take it at once, and this generation's commits, expecting the revision the
        marker replaced, are fenced. A no-op when it is not held at ``generation``."""
        async with locked(self._consumer_locks, [(consumer, partition)]):
            lease = await self._held(consumer, partition, generation)
            if lease is None:
                return
            subject = self._layout.lease(consumer, partition)
            await self._publish_lease(Outgoing(subject, b"", {**TOMBSTONE, **expect_last(lease.revision, subject)}),
                                      f"the release of the lease of {consumer} partition {partition}")
            if self._leases.get((consumer, partition)) is lease:
                self._leases.pop((consumer, partition), None)

    async def leases(self) -> list[LeaseInfo]:
        """The leases the bucket holds (those of :meth:`acquire` included, ``expires_in=None``),
        sorted by ``(consumer, partition)``; ``expires_in`` from the lessee's record and this
        engine's clock (0 for one lapsed that the server has not removed yet)."""
        now = self._clock.now()
        found = [records.lease_info(stored.data, stored.seq, now)
                 for stored in await self._js().scan(self._layout.leases()) if not is_deleted(stored)]
        return sorted(found, key=lambda lease: (lease.consumer, lease.partition))

    async def _lease_revision(self, consumer: str, partition: int) -> int:
        stored = await self._js().last(self._layout.lease(consumer, partition))
        return 0 if stored is None else stored.seq

    async def _refusal(self, consumer: str, partition: int, lease_generation: int, fence: int,
                       error: JetStreamRequestError) -> Exception:
        """The error to raise for a refused batch: ``FencedError`` when the lease moved on."""
        if error.code == WRONG_LAST_SEQUENCE:
            revision = await self._lease_revision(consumer, partition)
            if revision != fence:
                return FencedError(f"{consumer} partition {partition}: lease generation {lease_generation} is stale "
                                   f"(the lease is at revision {revision})")
        return NatsEngineError(f"{self.url}: bucket {self.bucket}: the commit of {consumer} partition {partition} "
                               f"was refused: {error}")
