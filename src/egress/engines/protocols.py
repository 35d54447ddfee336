"""The boundary between the runtime and storage: ``Engine`` = ``Log`` + ``CheckpointStore`` +
``Ownership`` + ``Membership`` + its lifecycle.

Every engine (embedded SQLite today, NATS JetStream later) implements :class:`Engine`; the runtime
is typed against it and knows nothing else about storage. The records below are the engine-neutral
data shapes. ``tests/engines/`` is the conformance suite every engine must pass.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

# Defined in egress.errors with the rest of the tree; re-exported here, where the engine protocols raise them.
from egress.errors import EngineUnavailableError as EngineUnavailableError
from egress.errors import FencedError as FencedError
from egress.line_chunks import LineChunk


class LogMessage(NamedTuple):
    """A message of a partitioned stream.

    ``offset`` is its position in ``(stream, partition)`` (0-based, dense); ``message_id`` the
    stable id (bytes) that becomes the idempotency key; ``key`` the encoded ``group_by`` values;
    ``event_timestamp`` seconds since the Unix epoch or ``None``; ``row`` the column values.
    """

    stream: str
    partition: int
    offset: int
    message_id: bytes
    key: bytes
    event_timestamp: float | None
    row: dict[str, Any]


class OutboxMessage(NamedTuple):
    """A committed output message of one partition job, waiting for that job's sinks.

    ``seq`` numbers a partition job's outputs densely from 1 in commit order (Flow's seq no).
    """

    seq: int
    stream: str
    message_id: bytes
    key: bytes
    event_timestamp: float | None
    row: dict[str, Any]


class LogChunk(NamedTuple):
    """A chunk of lines appended to the log as one stored row (``LineChunkLog`` engines): its
    ``chunk.count`` messages take the next offsets of ``(stream, partition)``, each with key
    ``encode_key([])``, no event timestamp and the row ``{chunk.column: line}``."""

    stream: str
    partition: int
    chunk: LineChunk


class ChunkAt(NamedTuple):
    """A stored chunk as ``LineChunkLog.read_chunks`` returns it: its first record's ``offset``."""

    offset: int
    chunk: LineChunk


class OutboxChunk(NamedTuple):
    """Outbox messages ``first_seq`` .. ``first_seq + chunk.count - 1`` of ``stream`` that are the
    log records from ``log_offset`` of ``(log_stream, log_partition)`` unchanged (an identity's
    output), each log id with ``id_suffix`` appended; stored as a reference to the log, read back as
    rows. ``chunk`` holds them, ids suffixed, in memory for the sinks (not stored)."""

    first_seq: int
    stream: str
    log_stream: str
    log_partition: int
    log_offset: int
    id_suffix: bytes
    chunk: LineChunk


LogAppend = tuple[str, int, bytes, bytes, float | None, dict[str, Any]]
"""One message to append to the log: ``(stream, partition, message_id, key, event_timestamp, row)``;
the engine assigns its offset."""


@dataclass(frozen=True, slots=True)
class SinkProgress:
    """Flow's sink state per sink and partition: what has been acknowledged and persisted.

    ``sink_state`` is the sink's own committed state beside its progress (opaque bytes, empty for
    sinks without any): the Firehose sink keeps its batch boundaries there, so that a batch has the
    same records, and so the same request id, after a restart.
    """

    producer_id: str = ""
    max_persisted_message_id: bytes | None = None
    max_persisted_seq_no: int = 0
    sink_state: bytes = b""


@dataclass(slots=True)
class EpochCommit:
    """Everything one epoch of one consumer changes, committed atomically or not at all.

    ``consumer`` names the computation (or ``source:<id>`` for a source reader) and ``partition``
    its partition; ``generation`` is the lease's fence from :class:`Ownership` (a stale owner's
    commit fails).
    ``input_positions`` maps ``(stream, partition)`` (a source uses ``("", 0)``) to the new
    offset consumed. ``log_appends`` are :data:`LogAppend` tuples, given offsets by the engine in
    list order, continuing each ``(stream, partition)`` densely; ``outbox`` are new output
    messages for sinks; ``sink_progress`` by sink id (replacing the previous one, ``sink_state``
    included); ``outbox_acknowledged_seq`` lets the engine drop outbox messages up to that seq,
    which every sink has persisted.
    ``state_writes`` (``(state name, encoded key) → value bytes or None to delete``) is the
    consumer's internal state; ``external_state_writes`` (``(table, encoded key) → row bytes or
    None``) the user-named external state tables; ``timers_set`` / ``timers_deleted`` are
    ``(encoded key, trigger timestamp, domain)`` with domain ``"processing"`` or ``"event"``
    (deletions apply before insertions); ``watermark`` the consumer's event-time watermark.
    ``log_traces`` (index in ``log_appends`` → context) and ``outbox_traces`` (``seq`` → context) are
    the W3C trace contexts some messages carry from their source event (:class:`TraceContexts`).
    """

    consumer: str
    partition: int
    generation: int
    input_positions: dict[tuple[str, int], int] = field(default_factory=dict)
    log_appends: list[LogAppend] = field(default_factory=list)
    outbox: list[OutboxMessage] = field(default_factory=list)
    sink_progress: dict[str, SinkProgress] = field(default_factory=dict)
    outbox_acknowledged_seq: int | None = None
    state_writes: dict[tuple[str, bytes], bytes | None] = field(default_factory=dict)
    external_state_writes: dict[tuple[str, bytes], bytes | None] = field(default_factory=dict)
    timers_set: list[tuple[bytes, float, str]] = field(default_factory=list)
    timers_deleted: list[tuple[bytes, float, str]] = field(default_factory=list)
    watermark: float | None = None
    log_chunks: list[LogChunk] = field(default_factory=list)
    """Chunks of lines appended after ``log_appends`` (only to a ``LineChunkLog`` engine)."""
    outbox_chunks: list[OutboxChunk] = field(default_factory=list)
    """Outbox references to the log (only to a ``LineChunkLog`` engine); their seqs follow ``outbox``'s."""
    # Carried trace contexts (egress.observe.tracing; only with tracing on, only messages that have
    # one): by index into log_appends, and by outbox seq. An engine without TraceContexts ignores them.
    log_traces: dict[int, str] | None = None
    outbox_traces: dict[int, str] | None = None

    @property
    def origin(self) -> str:
        """Who emitted this commit's rows, for errors: ``source 'id'`` or ``computation 'name' partition n``."""
        source = self.consumer.removeprefix(SOURCE_PREFIX)
        if source != self.consumer:
            return f"source {source!r}"
        return f"computation {self.consumer!r} partition {self.partition}"

    def log_rows(self) -> list[tuple[str, bytes, dict[str, Any]]]:
        """``(stream, message id, row)`` of each log append (what a row encoding error names)."""
        return [(stream, message_id, row) for stream, _, message_id, _, _, row in self.log_appends]

    def outbox_rows(self) -> list[tuple[str, bytes, dict[str, Any]]]:
        """``(stream, message id, row)`` of each outbox message."""
        return [(message.stream, message.message_id, message.row) for message in self.outbox]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a partition job loads on start: positions, sink progress, and unacknowledged outbox."""

    input_positions: dict[tuple[str, int], int]
    sink_progress: dict[str, SinkProgress]
    outbox: list[OutboxMessage]
    next_seq: int


@dataclass(frozen=True, slots=True)
class KeyedState:
    """What a partition job with state loads on start, for the keys of its partition only:
    ``internal`` (state name → encoded key → value bytes), ``external`` (table → encoded key →
    row bytes), pending ``timers`` ``(encoded key, trigger, domain)`` and the ``watermark``."""

    internal: dict[str, dict[bytes, bytes]]
    external: dict[str, dict[bytes, bytes]]
    timers: list[tuple[bytes, float, str]]
    watermark: float | None


@dataclass(frozen=True, slots=True)
class CommittedInventory:
    """Where committed work waits in a state directory, counted (for the drained check).

    ``log_ends``: ``(stream, partition)`` → end offset (offsets are dense from 0 and never removed,
    so a reader at offset ``o`` has ``end - o`` messages ahead of it); ``read_positions``:
    ``(stream, partition)`` → the offsets computations committed reading it (source readers'
    positions are not among them); ``outbox``: ``(computation, partition, stream)`` → committed
    output messages not yet persisted by every sink; ``timers``: ``(computation, partition)`` →
    pending timers.
    """

    log_ends: dict[tuple[str, int], int]
    read_positions: dict[tuple[str, int], list[int]]
    outbox: dict[tuple[str, int, str], int]
    timers: dict[tuple[str, int], int]


class Log(Protocol):
    """Partitioned streams of messages. Messages are appended only by a commit
    (:attr:`EpochCommit.log_appends`), so an append is as atomic and as fenced as the rest of it."""

    async def read(self, stream: str, partition: int, after: int, limit: int) -> list[LogMessage]:
        """Up to ``limit`` messages of ``(stream, partition)`` with offset >= ``after``, in offset
        order (``[]`` for a partition never written or when ``after`` is at its end). Fewer than
        ``limit`` does not mean the end: a read may stop at the end this instance knows (NATS:
        another worker's appends not announced yet); a read from there finds them."""
        ...

    async def end_offset(self, stream: str, partition: int) -> int:
        """The offset the next appended message of ``(stream, partition)`` will get."""
        ...


class CheckpointStore(Protocol):
    """Loads checkpoints and commits epochs atomically."""

    async def load_checkpoint(self, consumer: str, partition: int, sinks: list[str], *,
                              with_outbox: bool = True) -> Checkpoint:
        """The committed positions of ``(consumer, partition)``, the progress of each of ``sinks``
        (``SinkProgress()`` for one that never committed any), the outbox messages some of
        ``sinks`` has not yet persisted (seq above the lowest ``max_persisted_seq_no``; none with
        ``with_outbox=False``, for a caller that reads them in pages with
        :meth:`OutboxReader.read_outbox`), and the next seq (above every committed outbox seq and
        persisted seq, even once all are trimmed)."""
        ...

    async def load_keyed_state(self, consumer: str, partition: int, partition_count: int,
                               external_tables: list[str]) -> KeyedState:
        """``partition``'s share of the keyed state: the internal state of ``consumer`` and the rows
        of ``external_tables`` (shared by name between consumers) whose encoded keys have
        ``egress.keys.partition_of(key, partition_count) == partition``, the timers and the
        watermark committed by ``(consumer, partition)`` (``None`` before any)."""
        ...

    async def commit(self, commit: EpochCommit) -> None:
        """Apply ``commit`` in one transaction; raises ``FencedError`` if ``commit.generation`` is stale,
        and :class:`~egress.errors.RowEncodingError` (naming the stream, column and message id) for a
        row holding a value that cannot be stored. Either way nothing of it is applied. Rows read
        back with the same values and types they were committed with (``bytes`` stay ``bytes``)."""
        ...


SOURCE_PREFIX = "source:"
"""Consumers named ``source:<id>`` are source readers (partition: the reader's, 0 for a source
with one reader); every other consumer but a role's is a computation.
``egress.runtime.unit.Unit.consumer`` makes these keys."""

ROLE_PREFIX = "role:"
"""Consumers named ``role:<name>`` are leases of a role, not of a job (the cluster's throttler
controller, ``role:throttler-controller``): their holder reads no log and commits nothing, so an
engine's log retention does not wait for them."""


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A live lease as :meth:`Ownership.leases` reports it.

    ``consumer`` is the computation id or ``source:<id>``; ``partition`` its partition; ``owner``
    the worker id that holds it (``""`` for a lease taken by :meth:`Ownership.acquire`, which names
    no owner); ``generation`` the fence its holder commits with; ``expires_in`` the seconds until it
    lapses as the engine sees it (``None``: it has no TTL and never lapses).
    """

    consumer: str
    partition: int
    owner: str
    generation: int
    expires_in: float | None


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """A worker of a cluster as :class:`Membership` lists it.

    ``worker_id`` names it (unique in the cluster); ``spec_digest`` is the hex digest of the Spec
    it runs (the runtime computes it; a joiner with another digest is refused); ``details`` is
    JSON-serialisable information for ``/status``, e.g. ``{"host": ..., "pid": ..., "status_url":
    ..., "started_at": ...}``.
    """

    worker_id: str
    spec_digest: str
    details: dict[str, Any] = field(default_factory=dict)


class Ownership(Protocol):
    """Which process runs which partition: a lease whose generation is the fence.

    :meth:`acquire` takes a lease unconditionally and without TTL (the embedded single-process
    runner); :meth:`try_acquire`, :meth:`renew` and :meth:`release` are the cluster's leases with a
    TTL measured by the engine (SQLite: its clock; NATS: the server's per-message TTL, 1 s
    granularity). Every lease of one ``(consumer, partition)`` has a greater generation than the ones
    before, whichever method took it, and a commit is fenced unless it carries the latest.
    """

    async def acquire(self, consumer: str, partition: int) -> int:
        """Take ``(consumer, partition)`` and return its new generation (greater than every earlier one)."""
        ...

    async def try_acquire(self, consumer: str, partition: int, owner: str, ttl: float) -> int | None:
        """Take the lease of ``(consumer, partition)`` for worker ``owner`` for ``ttl`` seconds when
        it is free, lapsed, released, or this owner's own; return the new generation (greater than
        every earlier one: a commit under an earlier generation is then :class:`FencedError`). ``None`` while
        another owner's lease is live."""
        ...

    async def renew(self, consumer: str, partition: int, generation: int, ttl: float) -> bool:
        """Extend the lease held at ``generation`` by ``ttl`` seconds from now; ``False`` when it is
        no longer held at that generation (lapsed and taken, taken over, or released): the job must
        stop, its commits are fenced. A lapsed lease nobody took yet is renewed. Never makes a
        concurrent commit of the same generation fail (the engine serialises the two)."""
        ...

    async def release(self, consumer: str, partition: int, generation: int) -> None:
        """Give the lease up after the job's last commit, so another worker may take it at once; a
        no-op when it is not held at ``generation``. Later commits of ``generation`` are fenced."""
        ...

    async def leases(self) -> list[LeaseInfo]:
        """Every live lease of the pipeline (for ``/status``, balancing and failover tests), sorted
        by ``(consumer, partition)``; lapsed and released ones are not listed."""
        ...


class Membership(Protocol):
    """The live workers of a cluster, each listed while it heartbeats."""

    async def register(self, member: MemberInfo, ttl: float) -> None:
        """Join, or heartbeat: ``member`` (replacing what its ``worker_id`` registered before) stays
        listed for ``ttl`` seconds from now."""
        ...

    async def deregister(self, worker_id: str) -> None:
        """Leave at once (an orderly stop); a no-op for a worker not listed."""
        ...

    async def members(self) -> list[MemberInfo]:
        """The live members, sorted by ``worker_id``."""
        ...


class StateLocation(NamedTuple):
    """Where an engine keeps a pipeline's committed data, in a user's words: ``name`` ("state
    directory .egress/orders", "NATS bucket egress_orders at nats://127.0.0.1:4222") and
    ``start_over``, what lets a Spec start from nothing instead (a clause: "give this Spec another
    --state-dir"). Messages about committed data name it (``egress.runtime.layout``, ``egress run``)."""

    name: str
    start_over: str


AppendsCallback = Callable[[set[tuple[str, int]] | None], None]
"""What :meth:`Engine.on_appends` calls: with the ``(stream, partition)`` slots another process
appended to, or ``None`` when it is not known which (every reader should look)."""


class Engine(Log, CheckpointStore, Ownership, Membership, Protocol):
    """A storage engine as the runtime uses it: the four protocols and their lifecycle.

    The runtime (``Pipeline``, ``PartitionJob``, ``SourceReader``) calls nothing else; an engine
    that passes ``tests/engines/`` can run every pipeline. ``egress.runtime.Pipeline`` makes it
    through an ``EngineFactory`` (default: ``SqliteEngine`` in the state directory).
    """

    @property
    def location(self) -> StateLocation:
        """Where this engine keeps the pipeline's committed data (known before ``open()``)."""
        ...

    async def open(self) -> None:
        """Connect to or create the storage; every other method needs it. Raises
        :class:`~egress.errors.StateDirectoryError` (or another ``EgressError``) when the storage
        cannot be used, naming it and the fix."""
        ...

    async def close(self) -> None:
        """Release what ``open()`` took; committed data stays for the next ``open()``. Safe after a
        failed ``open()`` and a second time."""
        ...

    async def read_meta(self, key: str) -> str | None:
        """The pipeline's metadata value ``key`` (e.g. ``spec_layout``), ``None`` when never written."""
        ...

    async def write_meta(self, key: str, value: str) -> None:
        """Set the metadata value ``key`` durably, outside any epoch commit."""
        ...

    async def inventory(self) -> CommittedInventory:
        """Where committed work waits (:class:`CommittedInventory`): the drained check counts what
        no job of the current Spec can reach."""
        ...

    def on_appends(self, callback: AppendsCallback) -> None:
        """Register ``callback``, called on the event loop when ANOTHER process committed log
        appends to these ``(stream, partition)`` slots (``None``: unknown which: wake every
        reader). Lets a downstream job on another worker wake without polling. At-most-once and
        best effort (a notification may be lost): the runtime keeps a slow poll as a backstop.
        An engine whose processes cannot see each other's commits never calls it."""
        ...


# -- Capabilities ------------------------------------------------------------------------------
#
# What some engines can do beyond :class:`Engine`. The runtime asks for a capability one way only:
# ``isinstance(engine, Capability)`` on these runtime-checkable protocols (an engine has it when
# it has the members, so an engine declares nothing), never ``isinstance`` on a concrete engine
# class. Such a check proves only that the members exist, not their signatures: the runtime's
# tests on each engine (``tests/integration/runtime/test_retention.py``, the cluster tests) use them.


@runtime_checkable
class TraceContexts(Protocol):
    """An engine that keeps the trace contexts messages carry (``EpochCommit.log_traces`` and
    ``outbox_traces``: a W3C ``traceparent``, optionally ``"\n"`` and a ``tracestate``), so that a
    message keeps its source event's trace across restarts; contexts go with their log batches and
    outbox messages when those are trimmed. Asked for only with tracing on."""

    async def read_log_traces(self, stream: str, partition: int, first: int, end: int) -> dict[int, str]:
        """The contexts of the log messages at offsets ``first <= offset < end``, by offset."""
        ...

    async def read_outbox_traces(self, consumer: str, partition: int, after_seq: int) -> dict[int, str]:
        """The contexts of the partition's committed outbox messages with ``seq > after_seq``, by seq."""
        ...


@runtime_checkable
class LogRetention(Protocol):
    """An engine whose log the runtime trims (SQLite; NATS purges what its consumers are past by
    itself): ``egress.runtime.retention`` calls :meth:`trim_log` now and then."""

    async def trim_log(self, readers: Mapping[str, Collection[str]], keep: int = 0) -> int:
        """Delete the log messages of each stream of ``readers`` (stream → the consumers that read
        it) that all of them have committed past, but the last ``keep`` of each log partition;
        returns the batches deleted."""
        ...


@runtime_checkable
class OutboxReader(Protocol):
    """An engine that reads a range of a partition's committed outbox again (SQLite, NATS), so a sink may
    leave a backlog there rather than in memory (``SinkContext.read_outbox``, the webhook sink)."""

    async def read_outbox(self, consumer: str, partition: int, after_seq: int, last_seq: int) -> list[OutboxMessage]:
        """The committed outbox messages of ``(consumer, partition)`` with ``after_seq < seq <=
        last_seq`` that are not trimmed yet, in ``seq`` order."""
        ...


@runtime_checkable
class LineChunkLog(Protocol):
    """An engine that stores a chunk of lines as one log row and an outbox entry as a reference to
    log records (SQLite): ``EpochCommit.log_chunks`` and ``outbox_chunks`` (byte chunks, issue 25).
    Its ``read`` gives a chunk's records as rows, ``load_checkpoint`` and ``read_outbox`` a
    reference's as ``OutboxMessage`` rows, and its log retention keeps what a reference names."""

    async def read_chunks(self, stream: str, partition: int, after: int, limit: int) -> list[ChunkAt | LogMessage]:
        """The log of ``(stream, partition)`` from offset ``after`` in offset order, about ``limit``
        messages: a stored chunk as one :class:`ChunkAt` (whole, except a first one the read starts
        inside, which begins at ``after``; so the result may hold more than ``limit`` messages), a
        stored row as its :class:`LogMessage`."""
        ...


MemberCallback = Callable[[str | None], None]
"""What :meth:`MemberNotices.on_members` calls: with the worker id a registration named, or
``None`` for a member that left (which one is not told)."""


@runtime_checkable
class MemberNotices(Protocol):
    """An engine that tells its workers of registrations and departures as they happen (NATS), so a
    worker lists the members when they change rather than polling between its heartbeats
    (``egress.runtime.cluster.worker``). The notices are at most once: the heartbeat's listing stays
    the backstop, and a member that lapsed (killed, cut off) sends none."""

    def on_members(self, callback: MemberCallback) -> None:
        """Call ``callback`` on every registration (heartbeats included) and deregistration of any
        worker, this engine's own included, from now on."""
        ...


@runtime_checkable
class MissedAppends(Protocol):
    """An engine that tells, cheaper than every job reading every input, whether the jobs' backstop
    wake is needed (NATS: one direct get of the bucket's last log chunk): an idle cluster's jobs are
    then not woken every ``remote_poll_period`` to read lanes nothing was appended to."""

    async def appends_missed(self) -> bool:
        """Called every ``remote_poll_period``: ``False`` only when every log append committed
        before the call before this one was readable by a read that such a call woke (so a job
        woken at each ``True`` has read, or been told of, every append, its notes missed or not);
        ``True`` at the first call. Raises what the engine's reads raise."""
        ...


@runtime_checkable
class MessageBus(Protocol):
    """An engine on a message bus its workers can also talk over (NATS): the cluster's throttler
    controller is elected among the workers and served on the bus (``egress.runtime.cluster``)."""

    servers: list[str]
    """The bus's server URLs (``nats://host:port``)."""

    bucket: str
    """The engine's bucket: it names the pipeline on the bus (the throttler's request subject)."""
