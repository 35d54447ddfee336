"""The interfaces connectors implement and the registry the runtime finds them in.

A source class turns a file (or later a queue) into typed rows with positions; a sink class
consumes the committed output messages of one partition job. Both are registered under their
class names (Flow's, and short aliases) and declare pydantic models for their parameters, which
the runtime validates before anything runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel

from egress.clock import Clock
from egress.connectors.dead_letters import DeadLetterFiles
from egress.engines import OutboxMessage, SinkProgress
from egress.errors import SpecError
from egress.line_chunks import LineChunk
from egress.observe import Metrics, StatusTree
from egress.spec import StreamSpec

if TYPE_CHECKING:
    from egress.throttler import Throttling


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One converted record: ``position`` (0-based record number), typed ``row``, and the event
    timestamp in seconds since the Unix epoch (``None`` when the source has no timestamp column)."""

    position: int
    row: dict[str, Any]
    event_timestamp: float | None
    source_partition: int = 0
    """Which of the source's inputs the position counts in (a followed file's number; 0 for a
    source with one input): the ``source partition`` of its message id."""
    trace_context: str | None = None
    """The W3C trace context the event arrived with (``traceparent``, optionally ``"\\n"`` and
    ``tracestate``: ``egress.observe.tracing.context_of_headers``), kept only with tracing on."""


class Source(Protocol):
    """A finite or endless reader of records, resumable at a position."""

    def records(self, start_position: int) -> Iterator[SourceRecord]:
        """Records from ``start_position`` on; raises ``SourceDataError`` for a bad record."""
        ...


@runtime_checkable
class ResumableSource(Source, Protocol):
    """A source that commits its own state with its position: the ``source state`` (opaque bytes,
    like a sink's ``sink_state``), e.g. the identity of the file a file source reads. The reader
    commits :attr:`source_state` in the same epoch as the position after the records yielded so
    far, and on a restart gives it back to :meth:`resume` before calling ``records``."""

    def resume(self, source_state: bytes) -> None:
        """The source state committed with the position ``records`` will be given (``b""`` before
        any commit); ``records`` raises ``SourceChangedError`` when the input no longer fits it."""
        ...

    @property
    def source_state(self) -> bytes:
        """The state to commit with the position after the last record yielded."""
        ...


@runtime_checkable
class LiveSource(Protocol):
    """An endless source read on the event loop (a JetStream stream, a followed file): records
    arrive while the pipeline runs, and it never ends by itself.

    The reader calls :meth:`start` once, then :meth:`take` epoch by epoch, committing
    :attr:`position` (and :attr:`source_state`) with each batch it took, and :meth:`close` at the end.
    """

    async def start(self, position: int, source_state: bytes, until_caught_up: bool) -> None:
        """Connect or open, resuming after the committed ``position`` and ``source_state``; with
        ``until_caught_up``, remember the input's end now: :meth:`take` returns ``None`` once every
        record before it was taken. Raises an ``EgressError`` naming the input and the fix."""
        ...

    async def take(self, limit: int, wait: float) -> list[SourceRecord] | None:
        """Up to ``limit`` records, waiting at most ``wait`` seconds for the first (``[]`` when none
        came); ``None`` when caught up (only with ``until_caught_up``). Raises ``SourceDataError``."""
        ...

    @property
    def position(self) -> int:
        """The position to commit after the records taken so far (the next one to read)."""
        ...

    @property
    def source_state(self) -> bytes:
        """The state to commit with :attr:`position` (``b""`` for a source without any)."""
        ...

    def committed(self) -> None:
        """The records taken so far are committed (a source that answers its producers, the
        ``http`` source, answers them now); a no-op for most."""
        ...

    async def close(self) -> None: ...


SOURCE_KEYS = "source_keys"
"""The internal state name under which a :class:`KeyedLiveSource`'s entries commit."""


@runtime_checkable
class KeyedLiveSource(LiveSource, Protocol):
    """A live source that also commits keyed entries with its batches (the ``http`` source's
    idempotency keys): internal state :data:`SOURCE_KEYS` of its reader, one entry per key, so
    a batch writes only what changed. Keys are encoded keys (``egress.keys.encode_key``), values JSON."""

    def restore_keys(self, entries: dict[bytes, bytes]) -> None:
        """The committed entries, before :meth:`LiveSource.start`."""
        ...

    def take_key_writes(self) -> dict[bytes, bytes | None]:
        """The entries to commit with the batch just taken (``None``: delete)."""
        ...


@runtime_checkable
class PartitionedSource(Protocol):
    """A source read by several readers at once, each a unit of its own (``source:<id>``,
    partitions ``0 .. count-1``, each with its own lease, position and state): its class says how
    many from its parameters (:func:`reader_count`), and the reader of partition ``index`` calls
    :meth:`read_partition` on the instance it creates before anything else, so it reads only its
    share of the input (a ``nats`` source the subjects of its JetStream partition, followed files
    the files reader 0 dealt to it, :class:`DealtSource`)."""

    def read_partition(self, index: int, count: int) -> None:
        """Read only share ``index`` (``0 .. count-1``) of the input from now on."""
        ...


@runtime_checkable
class DealtSource(Protocol):
    """A :class:`PartitionedSource` whose reader 0 deals the input among the readers (followed
    files: each new file to the reader with the fewest) and commits the deals in its source state:
    every reader's runner calls :meth:`deal_from` before it starts."""

    def deal_from(self, reader_state: Callable[[int], Awaitable[bytes]]) -> None:
        """``reader_state(k)``: reader ``k``'s committed source state (``b""`` before its first commit)."""
        ...


READERS_LIMIT = 1024
"""The most readers a source may have (a ``readers`` parameter above it is refused)."""


def reader_count(source_class: Any, parameters: Any) -> int:
    """How many readers (units ``source:<id>`` partitions ``0 .. n-1``) read a source of
    ``source_class`` with ``parameters``: the class's ``reader_count(parameters)`` when it has one,
    else 1. A count above 1 needs a class whose instances are :class:`PartitionedSource`."""
    count = getattr(source_class, "reader_count", None)
    return 1 if count is None else int(count(parameters))


class SourceClass(Protocol):
    parameters_model: ClassVar[type[BaseModel]]

    @classmethod
    def check(cls, parameters: Any, stream: StreamSpec, base_dir: Path) -> list[SpecError]:
        """Problems that need the stream or the file system (paths relative to the parameters)."""
        ...

    @classmethod
    def create(cls, source_id: str, parameters: Any, stream: StreamSpec, base_dir: Path) -> Source | LiveSource: ...


@dataclass(frozen=True)
class SinkContext:
    """What a sink instance gets from the runtime: who it is and the shared services.

    ``throttling`` is the process's :class:`egress.throttler.Throttling` (``None`` when the run has
    no throttlers), for sinks that share a global rate; ``dead_letters`` the run's dead-letter files,
    for sinks with a ``dead_letter_path`` (``egress redrive`` gives its own, to learn what failed).
    ``read_outbox(after_seq, last_seq)``, when the engine can (``engines.OutboxReader``), reads the
    partition's committed outbox messages with ``after_seq < seq <= last_seq`` again, in ``seq`` order:
    a sink that leaves a backlog in the outbox rather than in memory (``webhook_http``) reads it back.
    ``trace_contexts`` (tracing on only) are the carried W3C trace contexts of the partition's outbox
    messages by ``seq`` (``egress.observe.tracing``): a sink sends each on with its message's requests.
    ``metrics`` are the run's, bound to ``computation_id`` on creation (``Metrics.for_computation``):
    every sink sensor carries the computation as well as the sink id. ``on_progress(progress)`` is how
    the sink reports to its partition job (the one direction of acknowledgements): called with its
    :meth:`Sink.progress` whenever a delivery finished (acknowledged, or failed for good), the
    acknowledged prefix advanced or its ``sink_state`` changed; the job commits the last one reported
    with its next epoch.
    """

    computation_id: str
    sink_id: str
    partition: int
    clock: Clock
    metrics: Metrics
    status: StatusTree
    on_progress: Callable[[SinkProgress], None]
    throttling: Throttling | None = None
    dead_letters: DeadLetterFiles = field(default_factory=DeadLetterFiles)
    read_outbox: Callable[[int, int], Awaitable[list[OutboxMessage]]] | None = None
    # With tracing on (egress.observe.tracing): the carried trace context of each outbox message that
    # has one, by seq, kept by the partition job until the outbox is trimmed past it.
    trace_contexts: dict[int, str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", self.metrics.for_computation(self.computation_id))


class Sink(Protocol):
    """A sink instance of one partition job (Flow: one per sink per active partition job).

    Acknowledgements go one way: the sink advances its acknowledged prefix itself, in ``seq`` order,
    releases the messages in it and reports it with the wake-up (``SinkContext.on_progress``); the
    job commits what was reported. Queries (:meth:`progress`, :attr:`unacknowledged`,
    :attr:`terminal_error`) change nothing. Every sink class keeps this contract
    (tests/integration/connectors/sinks/test_contract.py).
    """

    def distribute(self, messages: list[OutboxMessage]) -> None:
        """Take committed messages in ``seq`` order; delivery starts now, acknowledgement later."""
        ...

    def progress(self) -> SinkProgress:
        """The acknowledged prefix (with the sink's own ``sink_state``) as last reported to
        ``SinkContext.on_progress`` (the one the sink was created with before any report)."""
        ...

    def committed(self, progress: SinkProgress) -> None:
        """``progress`` (a value the sink reported) is now committed: a sink that
        must not act before its state is durable (the Firehose sink sends a batch only once its
        boundary is committed) may act now."""
        ...

    def flush(self) -> None:
        """Send what the sink buffers now, for a caller that knows no more messages are coming soon
        (input held back by ``max_unacknowledged``, or a finished input); a no-op for a sink that
        does not buffer."""
        ...

    def hold(self) -> None:
        """Start no delivery until :meth:`resume`; those started go on to their acknowledgement or
        failure (retries included). Called when the job's partition is handed over to another
        worker (the job commits what was acknowledged once :attr:`in_flight` is 0, and the new
        owner delivers the rest, so nothing is sent twice), while the job's acknowledgements wait
        for a commit that is not completing, and while the worker's lease may have lapsed
        (``egress.runtime.holds``): a delivery then would only be sent again by the next owner."""
        ...

    def resume(self) -> None:
        """Start deliveries again after :meth:`hold` (those held back start now); a no-op when not held."""
        ...

    @property
    def in_flight(self) -> int:
        """Deliveries (messages, or batches for a batching sink) started and not finished yet."""
        ...

    @property
    def unacknowledged(self) -> int:
        """Distributed messages not in :meth:`progress`: what the sink still holds, and what
        ``max_unacknowledged`` bounds. Goes up in :meth:`distribute`, down when the sink reports a
        prefix that covers them."""
        ...

    @property
    def terminal_error(self) -> str | None:
        """Set once a delivery failed for good; nothing after it is acknowledged by this instance."""
        ...

    def reconfigure(self, dynamic_parameters: Any) -> None:
        """Apply new dynamic parameters (already validated) to every later decision."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class ChunkSink(Protocol):
    """A sink that takes committed messages as a chunk of lines (the byte-chunk path,
    ``docs/architecture.md``): the records of one column, kept as bytes, never made rows."""

    def takes_chunks(self, column: str) -> bool:
        """Whether :meth:`distribute_chunk` applies to payloads in ``column`` with this sink's parameters."""
        ...

    def distribute_chunk(self, first_seq: int, chunk: LineChunk) -> None:
        """:meth:`Sink.distribute` of messages ``first_seq`` .. ``first_seq + chunk.count - 1``, each
        record of ``chunk`` the payload of its message (id ``chunk.message_id(i)``)."""
        ...


@runtime_checkable
class FansOut(Protocol):
    """A sink that delivers to many endpoints (``webhook_http``): ``/status`` shows each endpoint's
    row (``endpoint``, ``state``, ``backlog``, ``acknowledged_seq``, ``delivered``, ...) and
    ``egress endpoint resume NAME`` reaches :meth:`resume_endpoint`."""

    def endpoint_rows(self) -> list[dict[str, Any]]: ...

    def resume_endpoint(self, name: str) -> bool:
        """Resume endpoint ``name`` (its breaker closed); False when this instance does not know it."""
        ...


@runtime_checkable
class BoundsUnacknowledged(Protocol):
    """A sink that needs fewer unacknowledged messages than the run's ``max_unacknowledged`` to keep
    its endpoint busy (the async HTTP sink: a few per connection): its partition job stops reading
    once the sink holds :attr:`unacknowledged_limit` (or ``max_unacknowledged``, the smaller), so
    a backlog waits in the log, not in memory."""

    @property
    def unacknowledged_limit(self) -> int: ...


class SinkClass(Protocol):
    parameters_model: ClassVar[type[BaseModel]]
    dynamic_parameters_model: ClassVar[type[BaseModel]]

    @classmethod
    def check(cls, parameters: Any, input_streams: dict[str, StreamSpec]) -> list[SpecError]:
        """Construction checks against the sink's input streams (paths relative to the sink)."""
        ...

    @classmethod
    def create(
        cls, context: SinkContext, parameters: Any, dynamic_parameters: Any, progress: SinkProgress
    ) -> Sink: ...


def single_input_stream(sink_kind: str, input_streams: dict[str, StreamSpec]) -> StreamSpec | SpecError:
    """The one input stream of a sink that takes exactly one, or the upstream construction error
    ``<sink_kind> expects exactly one input stream, got N`` (path ``input_stream_ids``)."""
    if len(input_streams) != 1:
        return SpecError(f"{sink_kind} expects exactly one input stream, got {len(input_streams)}",
                         path="input_stream_ids")
    return next(iter(input_streams.values()))


class Registry:
    """Connector classes by name. ``register`` adds a class under each of its names; ``declare``
    names the module that registers a class, imported when one of its names is first looked up (so a
    run imports only the connectors its Spec names)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._classes: dict[str, Any] = {}
        self._first_names: dict[Any, str] = {}
        self._modules: dict[str, str] = {}

    def declare(self, module: str, *names: str) -> None:
        """``module`` registers a class under ``names`` (the same names, first one first, as its
        ``register``); it is imported by the first :meth:`get` of one of them."""
        for name in names:
            self._modules[name] = module

    def register(self, *names: str) -> Callable[[Any], Any]:
        def decorate(cls: Any) -> Any:
            for name in names:
                self._classes[name] = cls
            self._first_names.setdefault(cls, names[0])
            return cls

        return decorate

    def get(self, name: str) -> Any:
        """The class named ``name``; raises ``KeyError`` with Flow's message when unknown, followed by
        the names a Spec may give."""
        cls = self._classes.get(name)
        if cls is None and name in self._modules:
            importlib.import_module(self._modules[name])
            cls = self._classes.get(name)
        if cls is None:
            raise KeyError(f'No {self.kind} class "{name}" is registered; registered: {", ".join(self.names())}')
        return cls

    def canonical_name(self, name: str) -> str:
        """The first name the class called ``name`` was registered under (``async_http`` gives
        ``NYT::NFlow::TAsyncHttpSink``), so two spellings of one class compare equal; raises ``KeyError``."""
        return self._first_names[self.get(name)]

    def names(self) -> list[str]:
        """Every registered or declared name, sorted (no module is imported)."""
        return sorted(self._classes.keys() | self._modules.keys())


SOURCES = Registry("source")
SINKS = Registry("sink")
