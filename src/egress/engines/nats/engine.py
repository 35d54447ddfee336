"""The scale-out engine: ``Log``, ``CheckpointStore`` and ``Ownership`` on NATS JetStream.

One KV bucket (a file-storage stream keeping one message per subject) holds a pipeline; the
subjects are in :mod:`egress.engines.nats.subjects`. A commit is one atomic batch (ADR-50): its
first message, the consumer partition's checkpoint, carries
``Nats-Expected-Last-Subject-Sequence: <lease revision>`` for the lease subject, so the server
stores the batch only while the committer's lease is the latest (the fence); the first log chunk
of each ``(stream, partition)`` carries the same check against the last chunk of that partition, so
two writers can never give out one offset twice. docs/cluster.md tells the whole protocol and why
it is exactly-once for internal state.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import json
import logging
import math
import os
import shlex
import socket
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsClientError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.errors import ServiceUnavailableError as NoJetStreamError
from nats.js.kv import KeyValue

from egress.clock import Clock, RealClock
from egress.engines.nats import records
from egress.engines.nats.errors import JetStreamRequestError, NatsEngineError, NatsUnavailableError
from egress.engines.nats.jetstream import (
    MAX_BATCH,
    WRONG_LAST_SEQUENCE,
    JetStream,
    Link,
    Outgoing,
    Stored,
    expect_last,
)
from egress.engines.nats.records import CheckpointRecord, LogEntry
from egress.engines.nats.subjects import BUCKET_NAME, Layout, default_bucket, name_of_token, name_token
from egress.engines.protocols import (
    ROLE_PREFIX,
    AppendsCallback,
    Checkpoint,
    CommittedInventory,
    EpochCommit,
    FencedError,
    KeyedState,
    LeaseInfo,
    LogMessage,
    MemberInfo,
    OutboxMessage,
    SinkProgress,
    StateLocation,
)
from egress.errors import RowEncodingError
from egress.keys import partition_of
from egress.nats_connections import NatsUnreachableError, close_connection, connect
from egress.rows import decode_row, encode_row, first_unstorable_row_error

logger = logging.getLogger(__name__)

LAYOUT_VERSION = 2  # 2: state and timer subjects per consumer partition and generation
MINIMUM_SERVER = (2, 12)  # atomic batch publish
TOMBSTONE = {"KV-Operation": "DEL"}
"""Headers of a deleted key: KV's delete marker, without a TTL. It replaces the value (the stream
keeps one message per subject) and stays while its generation is live: a marker that lapses or is
purged lets nats-server 2.15.1 bring the replaced value back after a SIGKILL and restart
(docs/cluster.md, "Retention"). A compaction drops a generation's markers with the generation."""
COMPACTION_MARKERS = 1000
"""Delete markers a consumer partition's live generation may gather before a commit compacts it
(at least as many as the live keys it started with, so compaction costs O(1) writes per deletion)."""

_LOG_ATTEMPTS = 20  # commits retried after another writer appended to the same log partition
_ACQUIRE_ATTEMPTS = 20
_CACHED_CHUNKS = 4  # decoded log chunks kept per (stream, partition)
_INDEXED_CHUNKS = 4096  # log chunk positions remembered per (stream, partition)
_HEADER_ROOM = 8 * 1024  # of the server's max_payload, left for headers
DUPLICATE_WINDOW = 120.0
"""Seconds the stream remembers a ``Nats-Msg-Id`` (the server's default, set explicitly): a commit
sent again after a lost answer must reach the server within it, so ``outage_timeout`` plus
``request_timeout`` must stay below it."""


@dataclass(slots=True)
class _Lease:
    """A lease this engine took: the revision that took it (the epoch), its latest revision (what
    commits expect: renewals move it) and the worker it names (``""`` for :meth:`acquire`'s)."""

    epoch: int
    revision: int
    worker: str = ""


@dataclass(slots=True)
class _OutboxChunk:
    first: int
    last: int
    seq: int


@dataclass(slots=True)
class _Redo:
    """Keyed writes committed as redo chunks and not yet applied: ``(subject, record, deleted)``."""

    writes: list[tuple[str, bytes, bool]]
    last_seq: int


@dataclass(slots=True)
class _View:
    """What this process knows of a consumer partition it commits: the committed checkpoint, the
    outbox chunks still stored, and keyed writes waiting to be applied."""

    checkpoint: CheckpointRecord
    outbox: list[_OutboxChunk]
    redo: _Redo | None


@dataclass(slots=True)
class _Chunk:
    first: int
    count: int
    seq: int
    entries: list[LogEntry] | None = None

    @property
    def end(self) -> int:
        return self.first + self.count


@dataclass(slots=True)
class _LogIndex:
    """The log chunks of one ``(stream, partition)`` this process has seen, by first offset; the
    entries of the last few read or written stay decoded."""

    firsts: list[int] = field(default_factory=list)
    chunks: dict[int, _Chunk] = field(default_factory=dict)
    decoded: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def add(self, chunk: _Chunk) -> _Chunk:
        known = self.chunks.get(chunk.first)
        if known is None:
            bisect.insort(self.firsts, chunk.first)
            self.chunks[chunk.first] = known = chunk
            if len(self.firsts) > _INDEXED_CHUNKS:  # forget the lowest (the highest if that is the new one)
                victim = self.firsts.pop(0 if self.firsts[0] != chunk.first else -1)
                self.chunks.pop(victim)
                self.decoded.pop(victim, None)
        if chunk.entries is not None:
            known.entries = chunk.entries
            self.decoded[chunk.first] = None
            self.decoded.move_to_end(chunk.first)
            while len(self.decoded) > _CACHED_CHUNKS:
                dropped = self.chunks.get(self.decoded.popitem(last=False)[0])
                if dropped is not None:
                    dropped.entries = None
        return known

    def floor(self, offset: int) -> _Chunk | None:
        """The known chunk with the largest first offset <= ``offset``."""
        index = bisect.bisect_right(self.firsts, offset)
        return self.chunks[self.firsts[index - 1]] if index else None


class NatsEngine:
    """``Log``, ``CheckpointStore`` and ``Ownership`` of pipeline ``pipeline`` in a NATS JetStream
    KV bucket (default ``egress_<pipeline>``) on ``servers`` (``nats://host:port``, one or a list).

    ``open()`` connects (within ``connect_timeout`` seconds) and creates or updates the bucket's
    stream: file storage, ``replicas`` copies (1; 3 on a cluster), atomic batches and direct gets
    allowed, one message per subject. An unreachable server, a server older than 2.12 or one
    without JetStream raises :class:`NatsEngineError` naming the URL; a bucket of another pipeline
    raises it naming the bucket. ``owner`` (default ``host:pid``) and ``lease_ttl`` (seconds) are
    recorded in each lease. Every ``retention_period`` seconds (on the clock) a commit also purges
    the log chunks every consumer has passed (:meth:`trim`). ``request_timeout`` bounds each
    request (seconds).

    A deleted key or timer is a delete marker without a TTL (:data:`TOMBSTONE`) in its consumer
    partition's live generation of subjects; once a generation holds more than
    ``compaction_markers`` markers and more than the live keys it started with, a commit writes
    the live keys and timers into a new generation (fenced batches), names it in the checkpoint,
    and purges the older generations, which readers ignore from then on: a purge that a SIGKILL
    of nats-server undoes brings back only subjects of a generation no checkpoint names. A
    member leaves by a delete marker that lapses after a second; a lease's marker is one per unit.

    After ``open()``, a lost connection or a server that cannot answer yet (restarted, JetStream
    recovering, a cluster electing a stream leader) makes every operation wait for the connection
    to come back and try again, for up to ``outage_timeout`` seconds, then raise
    :class:`NatsUnavailableError` (retryable: nothing committed is lost). A commit sent again is
    applied once: its batch carries the same ``Nats-Msg-Id`` each time, and the server refuses a
    replay of a stored one (docs/cluster.md, "Failures"). After a commit raised anything but
    ``FencedError``, its outcome is unknown to the caller: the consumer partition's next commit is
    refused until ``load_checkpoint`` reloads it.
    """

    def __init__(self, servers: str | Sequence[str], pipeline: str, *, bucket: str | None = None,
                 replicas: int = 1, owner: str | None = None, lease_ttl: float = 30.0,
                 connect_timeout: float = 5.0, request_timeout: float = 10.0, retention_period: float = 10.0,
                 outage_timeout: float = 60.0, compaction_markers: int = COMPACTION_MARKERS,
                 clock: Clock | None = None) -> None:
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        self.pipeline = pipeline
        self.bucket = bucket if bucket is not None else default_bucket(pipeline)
        if not BUCKET_NAME.fullmatch(self.bucket):
            raise NatsEngineError(f"bucket {self.bucket!r}: a NATS KV bucket name is made of A-Z a-z 0-9 _ -")
        self.replicas = replicas
        self.owner = owner if owner is not None else f"{socket.gethostname()}:{os.getpid()}"
        self.lease_ttl = lease_ttl
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.retention_period = retention_period
        self.compaction_markers = compaction_markers
        if outage_timeout + request_timeout >= DUPLICATE_WINDOW:
            raise NatsEngineError(f"outage_timeout {outage_timeout:g} s + request_timeout {request_timeout:g} s must "
                                  f"stay below the {DUPLICATE_WINDOW:g} s a server remembers a commit's message id")
        self.outage_timeout = outage_timeout
        self._link = Link()
        self._doubtful: set[tuple[str, int]] = set()
        self._clock = clock if clock is not None else RealClock()
        self._layout = Layout(self.bucket)
        self._connection: Client | None = None
        self._stream: JetStream | None = None
        self._kv: KeyValue | None = None
        self._budget = 0
        self._leases: dict[tuple[str, int], _Lease] = {}
        self._views: dict[tuple[str, int], _View] = {}
        self._consumer_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._slot_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._log_ends: dict[tuple[str, int], tuple[int, int]] = {}
        self._indexes: dict[tuple[str, int], _LogIndex] = {}
        self._trimmed: dict[tuple[str, int], int] = {}
        self._last_trim = float("-inf")
        self._trimming = False
        self._instance = uuid.uuid4().hex  # tells this engine's appends notes from other instances'
        self._appends_callbacks: list[AppendsCallback] = []
        self._appends_subscription: Subscription | None = None
        self._subscribing: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return ", ".join(self.servers)

    @property
    def location(self) -> StateLocation:
        """The bucket on its servers; a Spec starts over under another pipeline name (its own
        bucket) or once the bucket is deleted (``egress state delete``, :meth:`delete_bucket`)."""
        command = f"egress state delete {shlex.quote(self.pipeline)} --engine {','.join(self.servers)}"
        return StateLocation(f"NATS bucket {self.bucket} at {self.url}",
                             f"give this Spec another pipeline name (a bucket of its own), or, once every worker "
                             f"stopped, delete bucket {self.bucket} and everything committed in it: `{command}`")

    @property
    def connected(self) -> bool:
        """Whether the connection to a server is up now (False before ``open()``, while reconnecting
        and after ``close()``)."""
        connection = self._connection
        return connection is not None and connection.is_connected

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        connection = Client()
        self._connection = connection
        try:
            # pending_size 0: while disconnected a publish fails at once (and is tried again once the
            # connection is back) instead of waiting in a buffer to be sent after an attempt gave up.
            await connect(connection, self.servers, self.connect_timeout, label=self.url,
                          on_disconnected=self._link.dropped, on_reconnected=self._link.restored,
                          on_closed=self._link.closed,  # nothing to wait for: the next request fails, closed
                          disconnected_note=f" (operations wait up to {self.outage_timeout:g} s)",
                          pending_size=0, name=f"egress {self.pipeline}")
        except NatsUnreachableError as error:
            raise NatsEngineError(
                f"{self.url}: cannot connect to the NATS server within {self.connect_timeout:g} s ({error.cause}); "
                "start it (nats-server -js) or fix the URL") from None
        self._link.restored()
        version = connection.connected_server_version
        if (version.major, version.minor) < MINIMUM_SERVER:
            raise NatsEngineError(f"{self.url}: nats-server {version} is older than 2.12, which has atomic "
                                  "batch publish; upgrade the server")
        self._budget = connection.max_payload - _HEADER_ROOM
        self._stream = JetStream(connection, self._layout.stream, self.request_timeout, self.url,
                                 outage_timeout=self.outage_timeout, link=self._link)
        js = connection.jetstream(timeout=self.request_timeout)
        try:
            await self._ensure_stream(js)
            self._kv = await js.key_value(self.bucket)
            await self._check_meta(self._kv)
            if self._appends_callbacks:
                await self._subscribe_appends()
        except NoJetStreamError:
            raise NatsEngineError(f"{self.url}: JetStream is not enabled on this server; start nats-server "
                                  "with -js (or jetstream {} in its configuration)") from None
        except (NatsClientError, TimeoutError, OSError) as error:
            raise NatsEngineError(f"{self.url}: bucket {self.bucket}: {error or type(error).__name__}") from None

    async def delete_bucket(self) -> None:
        """Delete the pipeline's bucket (its stream ``KV_<bucket>``): every log message, outbox
        message, checkpoint, lease, state row and timer committed in it. After ``open()``; the engine
        is closed afterwards. Raises :class:`NatsEngineError` naming the bucket when the server refuses."""
        if self._connection is None:
            raise NatsEngineError(f"{self.url}: bucket {self.bucket}: delete_bucket() needs open() first")
        try:
            await self._connection.jetstream(timeout=self.request_timeout).delete_key_value(self.bucket)
        except (NatsClientError, TimeoutError, OSError) as error:
            raise NatsEngineError(f"{self.url}: bucket {self.bucket}: cannot delete it: "
                                  f"{error or type(error).__name__}") from None
        finally:
            await self.close()

    async def close(self) -> None:
        subscribing, self._subscribing = self._subscribing, None
        if subscribing is not None:
            subscribing.cancel()
            with contextlib.suppress(asyncio.CancelledError, NatsEngineError, NatsUnavailableError):
                await subscribing
        self._appends_subscription = None  # closing the connection ends it
        connection, self._connection = self._connection, None
        self._stream = self._kv = None
        if connection is not None:
            await close_connection(connection, self.url)

    # -- metadata and inventory --------------------------------------------------------------

    async def read_meta(self, key: str) -> str | None:
        """The pipeline's metadata value ``key`` (subject ``metadata.<key>``), ``None`` when never written."""
        stored = await self._js().last(self._layout.prefix + self._layout.metadata_key(key))
        return None if stored is None else stored.data.decode()

    async def write_meta(self, key: str, value: str) -> None:
        """Set the metadata value ``key`` (a KV put, stored on the stream's replicas before it returns)."""
        kv = self._kv
        if kv is None:
            raise NatsEngineError(f"{self.url}: the engine is not open; call open() first")
        js, what = self._js(), f"the metadata value {key}"
        async with js.answering(what):
            js.observed(await js.retrying(what, lambda: kv.put(self._layout.metadata_key(key), value.encode())))

    async def inventory(self) -> CommittedInventory:
        """Where committed work waits (:class:`CommittedInventory`): the last log chunk of each log
        partition, every checkpoint, outbox chunk and timer (keyed writes of a redo not yet applied
        included). Reads every outbox chunk and timer: for the drained check, not for a hot path."""
        js, layout = self._js(), self._layout
        log_ends: dict[tuple[str, int], int] = {}
        for slot in sorted({layout.owner_of(subject) for subject in await js.subjects(layout.all_log_chunks())}):
            stored = await js.last(layout.log_chunks(*slot))
            if stored is not None:
                first, count = records.log_chunk_extent(stored.data)
                log_ends[slot] = first + count
        read_positions: dict[tuple[str, int], list[int]] = {}
        acknowledged: dict[tuple[str, int], int] = {}
        generations: dict[tuple[str, int], tuple[int, int]] = {}  # (live generation, checkpoint sequence)
        for stored in await js.scan(layout.checkpoints()):
            consumer, partition = layout.owner_of(stored.subject)
            checkpoint = CheckpointRecord.decode(stored.data)
            acknowledged[(consumer, partition)] = checkpoint.acknowledged
            generations[(consumer, partition)] = (checkpoint.generation, stored.seq)
            if not consumer.startswith("source:"):
                for slot, (offset, _) in checkpoint.positions.items():
                    read_positions.setdefault(slot, []).append(offset)
        outbox: dict[tuple[str, int, str], int] = {}
        for stored in await js.scan(layout.all_outbox_chunks()):
            consumer, partition = layout.owner_of(stored.subject)
            for seq, stream in records.outbox_chunk_streams(stored.data):
                if seq > acknowledged.get((consumer, partition), 0):  # a chunk partly acknowledged stays whole
                    outbox[(consumer, partition, stream)] = outbox.get((consumer, partition, stream), 0) + 1
        pending = [redo for redo in await js.scan(layout.all_redos())
                   if redo.seq > generations.get(layout.owner_of(redo.subject), (0, 0))[1]]
        timers: dict[tuple[str, int], int] = {}
        live = await js.scan(layout.all_timers())
        for suffix, (_, _, deleted) in self._latest(live, pending, ("timer.",)).items():
            subject = layout.prefix + suffix
            owner = layout.owner_of(subject)
            if not deleted and layout.generation_of(subject) == generations.get(owner, (0, 0))[0]:
                timers[owner] = timers.get(owner, 0) + 1
        return CommittedInventory(log_ends, read_positions, outbox, timers)

    def _latest(self, stored: list[Stored], redos: list[Stored], prefixes: tuple[str, ...]
                ) -> dict[str, tuple[int, bytes, bool]]:
        """The latest ``(sequence, record, deleted)`` of each keyed subject (without the bucket
        prefix) of ``stored`` and of the writes of the pending redo chunks ``redos`` to subjects
        starting with ``prefixes``: keyed writes of a commit not yet applied (a crash came between)
        are newer than what they replace."""
        latest = {self._layout.suffix(s.subject): (s.seq, s.data, _deleted(s)) for s in stored}
        for redo in redos:
            for suffix, record, deleted in records.redo_entries(redo.data):
                if suffix.startswith(prefixes) and latest.get(suffix, (0, b"", False))[0] < redo.seq:
                    latest[suffix] = (redo.seq, record, deleted)
        return latest

    def _stream_config(self) -> StreamConfig:
        return StreamConfig(
            name=self._layout.stream, description=f"egress pipeline {self.pipeline}",
            subjects=[f"{self._layout.prefix}>"], storage=StorageType.FILE, num_replicas=self.replicas,
            retention=RetentionPolicy.LIMITS, discard=DiscardPolicy.OLD, max_msgs=-1, max_bytes=-1,
            max_msgs_per_subject=1, allow_atomic=True, allow_direct=True, allow_rollup_hdrs=True,
            allow_msg_ttl=True, deny_delete=True, deny_purge=False, duplicate_window=DUPLICATE_WINDOW)

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        """Create the bucket's stream, or update it when a setting this engine relies on differs."""
        wanted = self._stream_config()
        try:
            info = await js.stream_info(self._layout.stream)
        except NotFoundError:
            await js.add_stream(wanted)
            return
        have = info.config
        checked = ("subjects", "storage", "num_replicas", "max_msgs_per_subject", "allow_atomic", "allow_direct",
                   "allow_msg_ttl", "allow_rollup_hdrs", "duplicate_window")
        if any(getattr(have, name) != getattr(wanted, name) for name in checked):
            await js.update_stream(wanted)

    async def _check_meta(self, kv: KeyValue) -> None:
        meta = json.dumps({"pipeline": self.pipeline, "layout": LAYOUT_VERSION}).encode()
        try:
            await kv.create(self._layout.meta_key, meta)
            return
        except KeyWrongLastSequenceError:
            found = json.loads((await kv.get(self._layout.meta_key)).value or b"{}")
        if found.get("pipeline") != self.pipeline:
            raise NatsEngineError(f"{self.url}: bucket {self.bucket} belongs to pipeline {found.get('pipeline')!r}, "
                                  f"not {self.pipeline!r}; choose another bucket")
        if found.get("layout") != LAYOUT_VERSION:
            raise NatsEngineError(f"{self.url}: bucket {self.bucket} has layout version {found.get('layout')}, "
                                  f"not {LAYOUT_VERSION}, which this egress reads")

    def _js(self) -> JetStream:
        if self._stream is None:
            raise NatsEngineError(f"{self.url}: the engine is not open; call open() first")
        return self._stream

    # -- Ownership ---------------------------------------------------------------------------

    async def acquire(self, consumer: str, partition: int) -> int:
        """Take the lease of ``(consumer, partition)`` (a KV update expecting its last revision) and
        return its new revision, the epoch. The lease records this engine's ``owner`` and
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
            self._views.pop((consumer, partition), None)
            self._doubtful.discard((consumer, partition))
            return revision
        raise NatsEngineError(f"{self.url}: bucket {self.bucket}: the lease of {consumer} partition {partition} "
                              f"changed under every one of {_ACQUIRE_ATTEMPTS} attempts to take it")

    def _fence(self, consumer: str, partition: int, epoch: int) -> int:
        """The lease revision a commit of ``epoch`` expects: its latest renewal's, or the epoch itself."""
        lease = self._leases.get((consumer, partition))
        return lease.revision if lease is not None and lease.epoch == epoch else epoch

    async def try_acquire(self, consumer: str, partition: int, owner: str, ttl: float) -> int | None:
        """Take the lease of ``(consumer, partition)`` for worker ``owner``: a message on its subject
        with ``Nats-TTL`` (``ttl`` rounded up to whole seconds, the server's granularity), expecting
        the subject's last sequence as read, so of two takers one wins. Returns its revision, the
        epoch; ``None`` while the subject holds another owner's lease (the server removes a lapsed
        one within a second of its TTL). A lease of :meth:`acquire` (no owner, no TTL) is taken over."""
        subject = self._layout.lease(consumer, partition)
        for _ in range(_ACQUIRE_ATTEMPTS):
            stored = await self._js().last(subject)
            holder = None if stored is None or _deleted(stored) else json.loads(stored.data).get("worker", "")
            if holder not in (None, "", owner):
                return None
            record = self._lease_record(consumer, partition, owner, ttl)
            expected = expect_last(0 if stored is None else stored.seq, subject)
            revision = await self._publish_lease(Outgoing(subject, record, {**expected, **_ttl_headers(ttl)}),
                                                 f"the lease of {consumer} partition {partition}")
            if revision is None:
                continue  # taken, released or lapsed between the read and the publish: read again
            self._leases[(consumer, partition)] = _Lease(revision, revision, owner)
            self._views.pop((consumer, partition), None)
            return revision
        raise NatsEngineError(f"{self.url}: bucket {self.bucket}: the lease of {consumer} partition {partition} "
                              f"changed under every one of {_ACQUIRE_ATTEMPTS} attempts to take it")

    def _lease_record(self, consumer: str, partition: int, worker: str, ttl: float,
                      epoch: int | None = None) -> bytes:
        """The JSON of a lease (``records``' module docs); ``epoch`` for a renewal, ``None`` when taking it."""
        now = self._clock.now()
        lease: dict[str, Any] = {"consumer": consumer, "partition": partition, "owner": self.owner, "ttl": ttl,
                                 "worker": worker, "expires_at": now + ttl}
        if epoch is None:
            lease["acquired_at"] = now
        else:
            lease.update(epoch=epoch, renewed_at=now)
        return json.dumps(lease).encode()

    async def renew(self, consumer: str, partition: int, epoch: int, ttl: float) -> bool:
        """Replace the lease held at ``epoch`` by one lapsing ``ttl`` seconds from now, expecting its
        current revision (which then becomes the fence of this epoch's commits); ``False`` when the
        subject moved on (lapsed and removed by the server, released, or taken). Waits for a commit
        of the same lease in flight, which would otherwise meet the new revision."""
        async with _locked(self._consumer_locks, [(consumer, partition)]):
            lease = await self._held(consumer, partition, epoch)
            if lease is None:
                return False
            subject = self._layout.lease(consumer, partition)
            record = self._lease_record(consumer, partition, lease.worker, ttl, epoch)
            revision = await self._publish_lease(
                Outgoing(subject, record, {**expect_last(lease.revision, subject), **_ttl_headers(ttl)}),
                f"the renewal of the lease of {consumer} partition {partition}")
            if revision is None:
                return False
            lease.revision = revision
            known = self._leases.get((consumer, partition))
            if known is None or known.epoch <= epoch:  # not over a lease taken meanwhile
                self._leases[(consumer, partition)] = lease
            return True

    async def _held(self, consumer: str, partition: int, epoch: int) -> _Lease | None:
        """The lease of ``(consumer, partition)`` as this engine took it at ``epoch``, else as stored
        when it is held at ``epoch`` (another engine instance took it), else ``None``."""
        lease = self._leases.get((consumer, partition))
        if lease is not None and lease.epoch == epoch:
            return lease
        stored = await self._js().last(self._layout.lease(consumer, partition))
        if stored is None or _deleted(stored):
            return None
        info = records.lease_info(stored.data, stored.seq, self._clock.now())
        return _Lease(epoch, stored.seq, info.owner) if info.epoch == epoch else None

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
        if message.payload and stored is not None and not _deleted(stored) and stored.data == message.payload:
            return stored.seq
        return None

    async def release(self, consumer: str, partition: int, epoch: int) -> None:
        """Delete the lease held at ``epoch`` (a KV delete marker expecting its current revision):
        another owner may take it at once, and this epoch's commits, expecting the revision the
        marker replaced, are fenced. A no-op when it is not held at ``epoch``."""
        async with _locked(self._consumer_locks, [(consumer, partition)]):
            lease = await self._held(consumer, partition, epoch)
            if lease is None:
                return
            subject = self._layout.lease(consumer, partition)
            await self._publish_lease(Outgoing(subject, b"", {**TOMBSTONE, **expect_last(lease.revision, subject)}),
                                      f"the release of the lease of {consumer} partition {partition}")
            if self._leases.get((consumer, partition)) is lease:
                self._leases.pop((consumer, partition), None)
                self._views.pop((consumer, partition), None)

    async def leases(self) -> list[LeaseInfo]:
        """The leases the bucket holds (those of :meth:`acquire` included, ``expires_in=None``),
        sorted by ``(consumer, partition)``; ``expires_in`` from the lessee's record and this
        engine's clock (0 for one lapsed that the server has not removed yet)."""
        now = self._clock.now()
        found = [records.lease_info(stored.data, stored.seq, now)
                 for stored in await self._js().scan(self._layout.leases()) if not _deleted(stored)]
        return sorted(found, key=lambda lease: (lease.consumer, lease.partition))

    # -- Membership --------------------------------------------------------------------------

    async def register(self, member: MemberInfo, ttl: float) -> None:
        """Write ``member.<worker id>`` with ``Nats-TTL`` (``ttl`` rounded up to whole seconds); the
        server removes it within a second of that unless a later register replaced it.
        ``details`` must be JSON-serialisable."""
        await self._js().publish(Outgoing(self._layout.member(member.worker_id), records.member_record(member),
                                          _ttl_headers(ttl)))

    async def deregister(self, worker_id: str) -> None:
        """Delete ``member.<worker id>``: a KV delete marker with ``Nats-TTL`` 1 s, so a worker id
        used once (``host-pid``) leaves nothing behind. What the marker replaced lapses by its own
        TTL, also if a SIGKILL of the server brings it back."""
        await self._js().publish(Outgoing(self._layout.member(worker_id), b"", {**TOMBSTONE, **_ttl_headers(1)}))

    async def members(self) -> list[MemberInfo]:
        found = [records.member_info(stored.data)
                 for stored in await self._js().scan(self._layout.members()) if not _deleted(stored)]
        return sorted(found, key=lambda member: member.worker_id)

    # -- append notifications ----------------------------------------------------------------

    def on_appends(self, callback: AppendsCallback) -> None:
        """Call ``callback`` with the slots another engine instance's commit appended to: each commit
        with log appends publishes an appends note on :attr:`Layout.appends` (core NATS: not stored,
        lost when nobody listens or the connection is down), to which this engine subscribes once a
        callback is registered (at ``open()`` if not yet open). Notes this instance sent are ignored."""
        self._appends_callbacks.append(callback)
        if self._connection is not None and self._appends_subscription is None and self._subscribing is None:
            self._subscribing = asyncio.get_running_loop().create_task(self._subscribe_appends())
            self._subscribing.add_done_callback(self._subscribed)

    def _subscribed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.warning("NATS %s: no append notes: %s", self.url, task.exception())
            self._subscribing = None  # the next registration tries again

    async def _subscribe_appends(self) -> None:
        connection = self._connection
        if connection is None or self._appends_subscription is not None:
            return

        async def on_note(message: Msg) -> None:
            try:
                sender, slots = records.appends_note_slots(message.data)
            except (ValueError, TypeError) as error:
                logger.warning("NATS %s: %s: an unreadable appends note: %s", self.url, message.subject, error)
                return
            if sender == self._instance:
                return
            for callback in list(self._appends_callbacks):
                try:
                    callback(slots)
                except Exception:  # one callback's failure must not end the notifications
                    logger.exception("an on_appends callback failed")

        async with self._js().answering("the subscription to append notes"):
            self._appends_subscription = await connection.subscribe(self._layout.appends, cb=on_note)
            await connection.flush(timeout=max(1, round(self.request_timeout)))

    async def _notify_appends(self, slots: list[tuple[str, int]]) -> None:
        """Tell other instances which log partitions a commit grew (best effort: the commit stands)."""
        connection = self._connection
        if connection is None or not slots:
            return
        try:
            await connection.publish(self._layout.appends, records.appends_note(self._instance, slots))
        except (NatsClientError, OSError) as error:
            logger.debug("NATS %s: an appends note was not sent: %s", self.url, error)

    async def _lease_revision(self, consumer: str, partition: int) -> int:
        stored = await self._js().last(self._layout.lease(consumer, partition))
        return 0 if stored is None else stored.seq

    async def _refusal(self, consumer: str, partition: int, epoch: int, fence: int,
                       error: JetStreamRequestError) -> Exception:
        """The error to raise for a refused batch: ``FencedError`` when the lease moved on."""
        if error.code == WRONG_LAST_SEQUENCE:
            revision = await self._lease_revision(consumer, partition)
            if revision != fence:
                return FencedError(f"{consumer} partition {partition}: epoch {epoch} is stale "
                                   f"(the lease is at revision {revision})")
        return NatsEngineError(f"{self.url}: bucket {self.bucket}: the commit of {consumer} partition {partition} "
                               f"was refused: {error}")

    # -- Log ---------------------------------------------------------------------------------

    async def read(self, stream: str, partition: int, after: int, limit: int) -> list[LogMessage]:
        messages: list[LogMessage] = []
        offset = after
        while len(messages) < limit:
            chunk = await self._chunk_containing((stream, partition), offset)
            if chunk is None or chunk.entries is None:
                break
            offset = max(offset, chunk.first)  # below a chunk only when retention purged the offsets between
            start = offset - chunk.first
            taken = chunk.entries[start:start + limit - len(messages)]
            if not taken:
                break
            messages.extend(LogMessage(stream, partition, offset + i, message_id, key, timestamp, decode_row(row))
                            for i, (message_id, key, timestamp, row) in enumerate(taken))
            offset += len(taken)
        return messages

    async def end_offset(self, stream: str, partition: int) -> int:
        stored = await self._js().last(self._layout.log_chunks(stream, partition))
        if stored is None:
            return 0
        first, count = records.log_chunk_extent(stored.data)
        return first + count

    def _index(self, slot: tuple[str, int]) -> _LogIndex:
        index = self._indexes.get(slot)
        if index is None:
            index = self._indexes[slot] = _LogIndex()
        return index

    async def _chunk_containing(self, slot: tuple[str, int], offset: int) -> _Chunk | None:
        """The decoded chunk holding ``offset``, or the first stored one after it (retention purged
        the offsets before), or ``None`` when ``offset`` is at the end."""
        index = self._index(slot)
        while True:
            known = index.floor(offset)
            if known is None:
                found = await self._first_chunk_from(slot, offset)
                if found is None or found.first > offset:
                    return found
                continue
            if offset < known.end:
                if known.entries is None:
                    stored = await self._js().get(known.seq)
                    if stored is None:  # purged meanwhile
                        return await self._first_chunk_from(slot, offset)
                    known = self._remember(slot, stored)
                return known
            following = await self._js().scan(self._layout.log_chunks(*slot), known.seq + 1, limit=2)
            if not following:
                return None
            for stored in following:
                self._remember(slot, stored)

    async def _first_chunk_from(self, slot: tuple[str, int], offset: int) -> _Chunk | None:
        """Look a chunk up by the offsets in the stored chunk subjects: the one holding ``offset``,
        else the first stored (``None`` when there is none)."""
        firsts = sorted(int(subject.rsplit(".", 1)[1])
                        for subject in await self._js().subjects(self._layout.log_chunks(*slot)))
        if not firsts:
            return None
        at = bisect.bisect_right(firsts, offset)
        first = firsts[at - 1] if at else firsts[0]
        stored = await self._js().last(self._layout.log_chunk(*slot, first))
        return None if stored is None else self._remember(slot, stored)

    def _remember(self, slot: tuple[str, int], stored: Stored) -> _Chunk:
        first, entries = records.log_chunk_entries(stored.data)
        return self._index(slot).add(_Chunk(first, len(entries), stored.seq, entries))

    async def _log_end(self, slot: tuple[str, int]) -> tuple[int, int]:
        """``(end offset, sequence of its last chunk)`` of a log partition, as last known here."""
        end = self._log_ends.get(slot)
        if end is None:
            stored = await self._js().last(self._layout.log_chunks(*slot))
            if stored is None:
                end = (0, 0)
            else:
                first, count = records.log_chunk_extent(stored.data)
                self._index(slot).add(_Chunk(first, count, stored.seq))
                end = (first + count, stored.seq)
            self._log_ends[slot] = end
        return end

    # -- CheckpointStore ---------------------------------------------------------------------

    async def load_checkpoint(self, consumer: str, partition: int, sinks: list[str]) -> Checkpoint:
        view, outbox = await self._load_view(consumer, partition, with_outbox=True)
        self._views[(consumer, partition)] = view
        self._doubtful.discard((consumer, partition))
        record = view.checkpoint
        progress = {sink: SinkProgress() for sink in sinks}
        progress.update(record.sinks)
        low = max(record.acknowledged, min((p.max_persisted_seq_no for p in progress.values()), default=0))
        next_seq = max([record.last_seq, *(p.max_persisted_seq_no for p in progress.values())]) + 1
        return Checkpoint({slot: offset for slot, (offset, _) in record.positions.items()}, progress,
                          [message for message in outbox if message.seq > low], next_seq)

    async def load_keyed_state(self, consumer: str, partition: int, partition_count: int,
                               external_tables: list[str]) -> KeyedState:
        js, layout = self._js(), self._layout
        checkpoint_stored = await js.last(layout.checkpoint(consumer, partition))
        checkpoint = (CheckpointRecord() if checkpoint_stored is None
                      else CheckpointRecord.decode(checkpoint_stored.data))
        generation = checkpoint.generation
        await self._retained(self._purge_generations(consumer, partition, generation))
        stored = [*await js.scan(layout.states(consumer, partition, generation)),
                  *await js.scan(layout.timers(consumer, partition, generation))]
        for table in external_tables:
            stored.extend(await js.scan(layout.externals(table)))
        redos = await self._pending_redos(consumer, partition, checkpoint_stored)
        latest = self._latest(stored, redos, (layout.suffix(layout.states(consumer, partition, generation))[:-1],
                                              layout.suffix(layout.timers(consumer, partition, generation))[:-1],
                                              *(f"external.{name_token(table)}." for table in external_tables)))
        internal: dict[str, dict[bytes, bytes]] = {}
        external: dict[str, dict[bytes, bytes]] = {table: {} for table in external_tables}
        timers: list[tuple[bytes, float, str]] = []
        table_of = {f"external.{name_token(table)}.": table for table in external_tables}
        for suffix, (_, data, deleted) in latest.items():
            if deleted:
                continue
            if suffix.startswith("timer."):
                key, trigger, domain = records.unpack(data)
                timers.append((bytes(key), float(trigger), str(domain)))
                continue
            name, key, value = records.unpack(data)
            if partition_of(key, partition_count) != partition:
                continue
            if suffix.startswith("state."):
                internal.setdefault(str(name), {})[bytes(key)] = bytes(value)
            else:
                external[table_of[suffix[:suffix.rindex(".") + 1]]][bytes(key)] = bytes(value)
        return KeyedState(internal, external, timers, checkpoint.watermark)

    async def commit(self, commit: EpochCommit) -> None:
        """Apply ``commit`` as one atomic, fenced batch (plus, for an epoch with more keyed writes
        than a batch holds, their redo afterwards); raises ``FencedError`` if ``commit.epoch`` is
        not the lease's revision, :class:`NatsEngineError` if the server refuses it otherwise."""
        consumer, partition = commit.consumer, commit.partition
        async with _locked(self._consumer_locks, [(consumer, partition)]):  # renew() and release() too
            fence = self._fence(consumer, partition, commit.epoch)
            if (consumer, partition) in self._doubtful:
                raise NatsEngineError(f"{self.url}: bucket {self.bucket}: an earlier commit of {consumer} partition "
                                      f"{partition} failed and may or may not have been stored; load_checkpoint "
                                      "(restart the job from its committed checkpoint) before committing again")
            try:
                await self._commit_locked(commit, fence)
            except (FencedError, RowEncodingError):  # refused before or by the server: nothing stored
                raise
            except BaseException:  # a lost connection, an outage, a cancellation: stored or not, unknown here
                self._doubtful.add((consumer, partition))
                self._views.pop((consumer, partition), None)
                raise
        if self._clock.monotonic() - self._last_trim >= self.retention_period and not self._trimming:
            await self._retained(self.trim())

    async def _commit_locked(self, commit: EpochCommit, fence: int) -> None:
        """:meth:`commit` with the consumer partition's lock held."""
        consumer, partition = commit.consumer, commit.partition
        view = self._views.get((consumer, partition))
        if view is None:
            view, _ = await self._load_view(consumer, partition, with_outbox=False)
            self._views[(consumer, partition)] = view
        if view.redo is not None:
            await self._apply_redo(consumer, partition, commit.epoch, fence, view)
        slots = sorted({(append[0], append[1]) for append in commit.log_appends})
        async with _locked(self._slot_locks, slots):
            await self._publish_commit(commit, fence, view, slots)
        await self._notify_appends(slots)
        if view.redo is not None:
            await self._apply_redo(consumer, partition, commit.epoch, fence, view)
        await self._retained(self._trim_outbox(consumer, partition, view))
        checkpoint = view.checkpoint
        if checkpoint.markers > max(self.compaction_markers, checkpoint.compacted):
            await self._compact(consumer, partition, commit.epoch, fence, view)

    async def _retained(self, purge: Awaitable[None]) -> None:
        """Run a purge after a commit: the commit stands whatever happens, and what a failed purge
        left is purged by a later one."""
        try:
            await purge
        except (NatsEngineError, NatsUnavailableError) as error:
            logger.warning("%s", error)

    async def _publish_commit(self, commit: EpochCommit, fence: int, view: _View,
                              slots: list[tuple[str, int]]) -> None:
        consumer, partition, layout = commit.consumer, commit.partition, self._layout
        entries = _log_entries(commit)
        outbox_messages, outbox_chunks = self._outbox_messages(commit)
        keyed = self._keyed_writes(commit, view.checkpoint.generation)
        hints = {slot: self._hint(slot, offset) for slot, offset in commit.input_positions.items()}
        checkpoint = view.checkpoint.updated(commit, hints)
        markers = sum(deleted for subject, _, deleted in keyed if not subject.startswith(layout.prefix + "external."))
        checkpoint = replace(checkpoint, markers=checkpoint.markers + markers)
        head = Outgoing(layout.checkpoint(consumer, partition), checkpoint.encode(),
                        expect_last(fence, layout.lease(consumer, partition)))
        message_id = uuid.uuid4().hex  # the same for every batch of this commit: the server stores at most one
        for _ in range(_LOG_ATTEMPTS):
            ends = {slot: await self._log_end(slot) for slot in slots}
            log_messages, log_chunks = self._log_messages(entries, ends)
            batch = [head, *log_messages, *outbox_messages]
            redo = len(batch) + len(keyed) > MAX_BATCH
            batch.extend(self._redo_messages(consumer, partition, keyed) if redo else
                         [Outgoing(subject, record, TOMBSTONE if deleted else None)
                          for subject, record, deleted in keyed])
            if len(batch) > MAX_BATCH:
                raise NatsEngineError(f"{self.url}: the commit of {consumer} partition {partition} needs {len(batch)} "
                                      f"messages of up to {self._budget} bytes, over the {MAX_BATCH} of one atomic "
                                      "batch; lower epoch_max_messages or raise the server's max_payload")
            try:
                last = await self._js().publish_batch(batch, message_id)
            except JetStreamRequestError as error:
                refusal = await self._refusal(consumer, partition, commit.epoch, fence, error)
                if isinstance(refusal, FencedError) or error.code != WRONG_LAST_SEQUENCE:
                    raise refusal from None
                for slot in slots:  # another writer appended to one of these log partitions: offsets again
                    self._log_ends.pop(slot, None)
                continue
            if last is None:  # stored by an attempt whose answer was lost: its sequences come from the server
                await self._stored_earlier(consumer, partition, view, checkpoint, slots)
                return
            first_seq = last - len(batch) + 1
            for number, chunk in enumerate(log_chunks, first_seq + 1):
                chunk[1].seq = number
                self._index(chunk[0]).add(chunk[1])
                self._log_ends[chunk[0]] = (chunk[1].end, number)
            for number, outbox_chunk in enumerate(outbox_chunks, first_seq + 1 + len(log_messages)):
                outbox_chunk.seq = number
            view.checkpoint = checkpoint
            view.outbox.extend(outbox_chunks)
            if redo:
                view.redo = _Redo(keyed, last)
            return
        raise NatsEngineError(f"{self.url}: bucket {self.bucket}: the log appends of {consumer} partition {partition} "
                              f"met another writer's appends {_LOG_ATTEMPTS} times in a row")

    async def _stored_earlier(self, consumer: str, partition: int, view: _View, checkpoint: CheckpointRecord,
                              slots: list[tuple[str, int]]) -> None:
        """Bring ``view`` and the log ends of ``slots`` up to a commit stored by an earlier attempt of
        the batch: the checkpoint is the one it carried; the outbox and redo chunks (and the log
        ends) are read back, their sequences being unknown here."""
        for slot in slots:
            self._log_ends.pop(slot, None)
        stored, _ = await self._load_view(consumer, partition, with_outbox=False)
        view.checkpoint, view.outbox, view.redo = checkpoint, stored.outbox, stored.redo

    def _hint(self, slot: tuple[str, int], offset: int) -> int:
        known = self._indexes.get(slot)
        chunk = None if known is None else known.floor(offset)
        return 0 if chunk is None else chunk.seq

    def _log_messages(self, by_slot: dict[tuple[str, int], list[LogEntry]],
                      ends: dict[tuple[str, int], tuple[int, int]]
                      ) -> tuple[list[Outgoing], list[tuple[tuple[str, int], _Chunk]]]:
        """The log chunks of the entries of each log partition (:func:`_log_entries`), at offsets
        from ``ends``; the first chunk of each log partition expects that partition's last chunk to
        be the one ``ends`` names."""
        messages: list[Outgoing] = []
        chunks: list[tuple[tuple[str, int], _Chunk]] = []
        for slot, entries in by_slot.items():
            first, last_seq = ends[slot]
            packed = [records.pack(list(entry)) for entry in entries]
            start = 0
            for group in self._groups(packed, f"a log message of {slot[0]} partition {slot[1]}"):
                headers = expect_last(last_seq, self._layout.log_chunks(*slot)) if start == 0 else None
                messages.append(Outgoing(self._layout.log_chunk(*slot, first + start),
                                         records.log_chunk(slot[0], slot[1], first + start, group), headers))
                chunks.append((slot, _Chunk(first + start, len(group), 0, entries[start:start + len(group)])))
                start += len(group)
        return messages, chunks

    def _outbox_messages(self, commit: EpochCommit) -> tuple[list[Outgoing], list[_OutboxChunk]]:
        """The outbox chunks of ``commit``; raises :class:`~egress.errors.RowEncodingError` for a row
        that cannot be stored."""
        consumer, partition, outbox = commit.consumer, commit.partition, commit.outbox
        try:
            entries = [records.outbox_entry(message) for message in outbox]
        except TypeError:
            raise first_unstorable_row_error(commit.origin, commit.outbox_rows()) from None
        messages: list[Outgoing] = []
        chunks: list[_OutboxChunk] = []
        start = 0
        for group in self._groups(entries, f"an outbox message of {consumer}"):
            first, last = outbox[start].seq, outbox[start + len(group) - 1].seq
            messages.append(Outgoing(self._layout.outbox_chunk(consumer, partition, first),
                                     records.outbox_chunk(group, first)))
            chunks.append(_OutboxChunk(first, last, 0))
            start += len(group)
        return messages, chunks

    def _keyed_writes(self, commit: EpochCommit, generation: int) -> list[tuple[str, bytes, bool]]:
        """``(subject, record, deleted)`` per key the commit writes (state and timers in
        ``generation``), the last write of a subject winning (timer deletions come before insertions)."""
        layout, consumer, partition = self._layout, commit.consumer, commit.partition
        writes: dict[str, tuple[str, bytes, bool]] = {}

        def write(subject: str, record: list[Any], deleted: bool) -> None:
            writes[subject] = (subject, records.pack(record), deleted)

        for (name, key), value in commit.state_writes.items():
            write(layout.state(consumer, partition, generation, name, key), [name, key, value], value is None)
        for (table, key), row in commit.external_state_writes.items():
            write(layout.external(table, key), [table, key, row], row is None)
        for timers, deleted in ((commit.timers_deleted, True), (commit.timers_set, False)):
            for key, trigger, *rest in timers:
                domain = rest[0] if rest else "processing"
                write(layout.timer(consumer, partition, generation, key, trigger, domain), [key, trigger, domain],
                      deleted)
        for subject, record, _ in writes.values():
            if len(record) > self._budget:
                raise NatsEngineError(f"{self.url}: {self._layout.suffix(subject)}: a value of {len(record)} bytes "
                                      f"is over the server's max_payload; raise max_payload in nats-server's "
                                      "configuration")
        return list(writes.values())

    def _redo_messages(self, consumer: str, partition: int, keyed: list[tuple[str, bytes, bool]]) -> list[Outgoing]:
        entries = [records.redo_entry(self._layout.suffix(subject), record, deleted)
                   for subject, record, deleted in keyed]
        return [Outgoing(self._layout.redo(consumer, partition, number), records.redo_chunk(group))
                for number, group in enumerate(self._groups(entries, f"a keyed write of {consumer}"))]

    def _groups(self, entries: list[bytes], what: str) -> list[list[bytes]]:
        groups = records.chunked(entries, self._budget)
        for group in groups:
            if len(group) == 1 and len(group[0]) > self._budget:
                raise NatsEngineError(f"{self.url}: {what} is {len(group[0])} bytes, over the server's max_payload; "
                                      "raise max_payload in nats-server's configuration")
        return groups

    async def _apply_redo(self, consumer: str, partition: int, epoch: int, fence: int, view: _View) -> None:
        """Write the pending redo's keyed writes to their own subjects (fenced batches), then purge it."""
        redo = view.redo
        assert redo is not None
        lease = self._layout.lease(consumer, partition)
        for start in range(0, len(redo.writes), MAX_BATCH):
            writes = redo.writes[start:start + MAX_BATCH]
            batch = [Outgoing(subject, record, TOMBSTONE if deleted else None) for subject, record, deleted in writes]
            batch[0] = batch[0]._replace(headers={**(batch[0].headers or {}), **expect_last(fence, lease)})
            try:
                await self._js().publish_batch(batch)  # None (stored by an earlier attempt) is as good
            except JetStreamRequestError as error:
                raise await self._refusal(consumer, partition, epoch, fence, error) from None
        await self._js().purge(self._layout.redos(consumer, partition), redo.last_seq + 1)
        view.redo = None

    async def _trim_outbox(self, consumer: str, partition: int, view: _View) -> None:
        """Purge the outbox chunks every sink has persisted."""
        acknowledged = view.checkpoint.acknowledged
        done = [chunk for chunk in view.outbox if chunk.last <= acknowledged]
        if not done:
            return
        kept = [chunk for chunk in view.outbox if chunk.last > acknowledged]
        await self._js().purge(self._layout.outbox_chunks(consumer, partition),
                               kept[0].seq if kept else done[-1].seq + 1)
        view.outbox = kept

    async def _load_view(self, consumer: str, partition: int, *, with_outbox: bool
                         ) -> tuple[_View, list[OutboxMessage]]:
        js, layout = self._js(), self._layout
        stored = await js.last(layout.checkpoint(consumer, partition))
        checkpoint = CheckpointRecord() if stored is None else CheckpointRecord.decode(stored.data)
        chunks: list[_OutboxChunk] = []
        outbox: list[OutboxMessage] = []
        for chunk in await js.scan(layout.outbox_chunks(consumer, partition)):
            if with_outbox:
                messages = records.outbox_chunk_messages(chunk.data)
                outbox.extend(messages)
                chunks.append(_OutboxChunk(messages[0].seq, messages[-1].seq, chunk.seq))
            else:
                chunks.append(_OutboxChunk(*records.outbox_chunk_range(chunk.data), chunk.seq))
        redo_chunks = await self._pending_redos(consumer, partition, stored)
        redo = None
        if redo_chunks:
            redo = _Redo([(layout.prefix + suffix, record, deleted) for chunk in redo_chunks
                          for suffix, record, deleted in records.redo_entries(chunk.data)], redo_chunks[-1].seq)
        return _View(checkpoint, chunks, redo), outbox

    # -- retention ---------------------------------------------------------------------------

    async def _pending_redos(self, consumer: str, partition: int, checkpoint: Stored | None) -> list[Stored]:
        """The redo chunks of a consumer partition not applied yet: those of the batch of its
        stored ``checkpoint`` (after it in that batch). An older one is one that a SIGKILL of the
        server brought back after its purge: applying it again would write old values."""
        after = 0 if checkpoint is None else checkpoint.seq
        return [redo for redo in await self._js().scan(self._layout.redos(consumer, partition)) if redo.seq > after]

    async def _compact(self, consumer: str, partition: int, epoch: int, fence: int, view: _View) -> None:
        """Write the live keys and timers of the consumer partition's generation into a new one
        (fenced batches, invisible until the checkpoint names it), commit the checkpoint naming it
        (fenced), then purge the older generations. A crash in between leaves the old generation
        live and the new one's subjects unnamed: a later compaction picks a higher generation and
        purges them."""
        js, layout, old = self._js(), self._layout, view.checkpoint.generation
        stored = [*await js.scan(layout.states(consumer, partition, old)),
                  *await js.scan(layout.timers(consumer, partition, old))]
        generation = max(js.read_floor, fence) + 1  # above every sequence stored yet: above every generation
        live = [Outgoing(layout.in_generation(s.subject, generation), s.data) for s in stored if not _deleted(s)]
        checkpoint = replace(view.checkpoint, generation=generation, markers=0, compacted=len(live))
        lease = layout.lease(consumer, partition)
        head = Outgoing(layout.checkpoint(consumer, partition), checkpoint.encode(), expect_last(fence, lease))
        groups = [live[start:start + MAX_BATCH - 1] for start in range(0, len(live), MAX_BATCH - 1)] or [[]]
        for number, group in enumerate(groups, 1):
            batch = [*group, head] if number == len(groups) else group
            batch[0] = batch[0]._replace(headers={**(batch[0].headers or {}), **expect_last(fence, lease)})
            try:
                await js.publish_batch(batch, uuid.uuid4().hex)  # None: stored by an earlier attempt, as good
            except JetStreamRequestError as error:
                raise await self._refusal(consumer, partition, epoch, fence, error) from None
        view.checkpoint = checkpoint
        await self._retained(self._purge_generations(consumer, partition, generation))

    async def _purge_generations(self, consumer: str, partition: int, live: int) -> None:
        """Purge the state and timer subjects of the consumer partition's generations below
        ``live`` (no checkpoint names them any more, and generations only grow, so a reader with
        an older checkpoint purges nothing a newer one names)."""
        js, layout = self._js(), self._layout
        for subject_filter in (layout.states(consumer, partition), layout.timers(consumer, partition)):
            found = {layout.generation_of(subject) for subject in await js.subjects(subject_filter)}
            for generation in sorted(found):
                if generation < live:
                    await js.purge(subject_filter[:-1] + f"{generation}.>", None)

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
                      if not _deleted(s) and not _is_role(key := layout.suffix(s.subject).split(".", 1)[1])}
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
                    self._trimmed[slot] = hint
        finally:
            self._trimming = False


def _is_role(lease_key: str) -> bool:
    """Whether a lease key ``<consumer token>.<partition>`` is a role's (``ROLE_PREFIX``): its holder
    commits nothing, so retention does not wait for it."""
    return name_of_token(lease_key.split(".", 1)[0]).startswith(ROLE_PREFIX)


def _deleted(stored: Stored) -> bool:
    """Whether ``stored`` is a KV delete or purge marker (a released lease, a member gone)."""
    return stored.headers.get("KV-Operation") in ("DEL", "PURGE")


def _ttl_headers(ttl: float) -> dict[str, str]:
    """The per-message TTL of a message that should live ``ttl`` seconds: whole seconds (the
    server's granularity), rounded up so that it never lapses early, at least 1."""
    return {"Nats-TTL": f"{max(1, math.ceil(ttl))}s"}


def _log_entries(commit: EpochCommit) -> dict[tuple[str, int], list[LogEntry]]:
    """The log appends of ``commit`` by ``(stream, partition)``, rows encoded (encoded once: a
    commit meeting another writer's appends is retried with the same entries); raises
    :class:`~egress.errors.RowEncodingError` for a row that cannot be stored."""
    by_slot: dict[tuple[str, int], list[LogEntry]] = {}
    try:
        for stream, partition, message_id, key, timestamp, row in commit.log_appends:
            by_slot.setdefault((stream, partition), []).append((message_id, key, timestamp, encode_row(row)))
    except TypeError:
        raise first_unstorable_row_error(commit.origin, commit.log_rows()) from None
    return by_slot


@contextlib.asynccontextmanager
async def _locked(locks: dict[tuple[str, int], asyncio.Lock], names: Iterable[tuple[str, int]]) -> AsyncIterator[None]:
    """Hold the locks of ``names`` (taken in sorted order, so two holders never wait on each other)."""
    async with contextlib.AsyncExitStack() as stack:
        for name in sorted(names):
            lock = locks.get(name)
            if lock is None:
                lock = locks[name] = asyncio.Lock()
            await stack.enter_async_context(lock)
        yield
