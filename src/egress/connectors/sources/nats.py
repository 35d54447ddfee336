"""The ``nats`` source: an existing JetStream stream that other applications publish into.

Position: the stream sequence of the next message to read (a message's record position is its
stream sequence), committed with the epoch, so a restart resumes right after the last committed
message, neither skipping nor repeating one. Message ids are
``source_message_id(scope(pipeline, source id, stream), 0, stream sequence)``: stable, whoever
reads the stream. Reading uses an ephemeral pull consumer (``AckNone``: the committed position is
the acknowledgement) starting at the committed sequence, optionally filtered by ``subject``; it is
made again at the current position when the server loses it.

``format: raw`` puts the payload bytes into ``payload_column``; ``format: json`` decodes the payload
as one JSON object into the schema (as a ``jsonl`` line). ``subject_column`` and ``header_columns``
fill columns from the message's subject and headers. Credentials are only referenced: a ``.creds``
file, or environment variables holding a token or a user and password; never in the Spec.

The stream must keep a message until egress has read it (retention limits that drop unread
messages drop them for egress too).

``readers: N`` reads the stream with N readers (units ``source:<id>`` partitions ``0 .. N-1``, spread
over a cluster's workers), each its own consumer on its share of the subjects: ``subject`` holds the
token ``{partition}``, which reader ``k`` replaces by ``k`` (``orders.{partition}.*`` → reader 1
filters ``orders.1.*``). The stream makes those partitions itself with JetStream's deterministic
subject mapping, a subject transform ``orders.*`` → ``orders.{{partition(N,1)}}.{{wildcard(1)}}``,
so a publisher puts its event's key in the hashed token (``orders.<key>``) and every event of a key
is read, in order, by one reader (``docs/sources.md``). Message ids stay the stream sequence's:
unique whichever reader reads a message.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from egress.connectors.base import READERS_LIMIT, SOURCES, SourceRecord
from egress.connectors.sources.bad_records import (
    BadRecordParameters,
    BadRecords,
    WithBadRecords,
    check_bad_record_parameters,
)
from egress.connectors.sources.live import CountedPosition, HeldFailure, referenced_file_errors
from egress.connectors.sources.schema import json_row, parse_timestamp, record_error
from egress.errors import EgressError, SecretUnavailable, SourceDataError, SpecError
from egress.nats_connections import NatsUnreachableError, close_connection, connect
from egress.observe import tracing
from egress.secret_references import read_secret
from egress.spec import StreamSpec

if TYPE_CHECKING:  # nats-py is imported when a nats source starts: `import egress` stays without it
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

PARTITION_TOKEN = "{partition}"
"""The token of a ``subject`` that each of several readers replaces by its partition number."""
CONSUMER_INACTIVE_THRESHOLD = 60.0
"""Seconds after which the server removes the ephemeral consumer of a reader that went away."""


class NatsSourceError(EgressError):
    """The ``nats`` source cannot reach its server or stream, or a credential it names is missing;
    raised when the source starts, naming the URL or stream and the fix."""


class NatsSourceParameters(BadRecordParameters):
    """``url`` (one or several comma-separated ``nats://`` or ``tls://`` servers, without
    credentials), ``stream`` (an existing JetStream stream), ``subject`` (a filter on it),
    ``format`` (``raw`` or ``json``), ``payload_column`` (raw: the column the payload bytes go to),
    ``subject_column``, ``header_columns`` (column → header name), ``timestamp_column``;
    credentials by reference: ``credentials_file`` (a NATS ``.creds`` file, relative to the Spec's
    folder), or ``token_env``, or ``user_env`` with ``password_env`` (names of environment variables);
    ``connect_timeout`` in seconds; ``on_bad_record`` and ``dead_letter_path``
    (``egress.connectors.sources.bad_records``); ``readers`` (1 to 1024): how many readers share the
    stream, each reading the subjects ``subject`` names with its partition number in place of the
    token ``{partition}`` (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(default="nats://127.0.0.1:4222", min_length=1)
    stream: str = Field(min_length=1)
    subject: str | None = None
    format: Literal["raw", "json"] = "json"
    payload_column: str | None = None
    subject_column: str | None = None
    header_columns: dict[str, str] = Field(default_factory=dict)
    timestamp_column: str | None = None
    credentials_file: str | None = None
    token_env: str | None = None
    user_env: str | None = None
    password_env: str | None = None
    connect_timeout: float = Field(default=5.0, gt=0)
    readers: int = Field(default=1, ge=1, le=READERS_LIMIT)

    @property
    def reads(self) -> str:
        """What the source reads: the stream (it scopes the message ids and is recorded in the state directory)."""
        return self.stream

    @property
    def reads_parameter(self) -> str:
        return "stream"

    def partition_subject(self, partition: int) -> str | None:
        """The subject filter of reader ``partition`` (``None``: the whole stream)."""
        if self.subject is None:
            return None
        return self.subject.replace(PARTITION_TOKEN, str(partition))

    def special_columns(self) -> list[str]:
        """The columns filled from the message rather than from its JSON."""
        named = [self.payload_column, self.subject_column, *self.header_columns]
        return [name for name in named if name is not None]


@SOURCES.register("nats", "NYT::NFlow::TNatsSource")
class NatsSource(CountedPosition, HeldFailure, WithBadRecords):
    """Reads a JetStream stream live (an :class:`~egress.connectors.base.LiveSource`)."""

    parameters_model: ClassVar[type[BaseModel]] = NatsSourceParameters

    def __init__(self, source_id: str, parameters: NatsSourceParameters, stream: StreamSpec, base_dir: Path) -> None:
        self.source_id = source_id
        self.parameters = parameters
        self.stream = stream
        self._base_dir = base_dir
        self.bad_records = BadRecords(source_id, parameters, base_dir)
        special = set(parameters.special_columns())
        self._json_columns = [c for c in stream.columns if c.name not in special]
        self._client: Client | None = None
        self._js: JetStreamContext | None = None
        self._subscription: JetStreamContext.PullSubscription | None = None
        self._position = 0
        self._end: int | None = None
        self._caught_up = False
        self._pending: int | None = None  # the consumer's pending messages after the last fetch
        self._filter = parameters.partition_subject(0)

    @classmethod
    def reader_count(cls, parameters: NatsSourceParameters) -> int:
        """``readers`` (``egress.connectors.base.reader_count``)."""
        return parameters.readers

    def read_partition(self, index: int, count: int) -> None:
        """Read the subjects of partition ``index`` only (``egress.connectors.base.PartitionedSource``)."""
        self._filter = self.parameters.partition_subject(index)

    @classmethod
    def check(cls, parameters: NatsSourceParameters, stream: StreamSpec, base_dir: Path) -> list[SpecError]:
        """Columns named by the parameters exist (and can take what they get), ``raw`` has a payload
        column, the URL holds no credentials, a ``credentials_file`` exists. Nothing is connected."""
        errors = check_bad_record_parameters(parameters, base_dir)
        for server in parameters.url.split(","):
            parts = urlsplit(server.strip())
            if parts.scheme not in ("nats", "tls") or not parts.hostname:
                errors.append(SpecError(f"{server.strip()!r} is not nats://HOST:PORT or tls://HOST:PORT",
                                        path="parameters/url"))
            elif parts.username or parts.password:
                errors.append(SpecError("the URL holds credentials: reference them instead (credentials_file, "
                                        "token_env, or user_env and password_env)", path="parameters/url"))
        named = {"payload_column": parameters.payload_column, "subject_column": parameters.subject_column,
                 "timestamp_column": parameters.timestamp_column,
                 **{f"header_columns/{c}": c for c in parameters.header_columns}}
        for field, column in named.items():
            if column is not None and stream.column(column) is None:
                errors.append(SpecError(f'column "{column}" is not in the output stream schema',
                                        path=f"parameters/{field}"))
        for field, column in named.items():
            found = stream.column(column) if column is not None and field != "timestamp_column" else None
            if found is not None and found.type != "string":
                errors.append(SpecError(f'column "{column}" is {found.type}; it gets text or bytes: make it string',
                                        path=f"parameters/{field}"))
        if parameters.format == "raw":
            if parameters.payload_column is None:
                errors.append(SpecError("format raw needs payload_column: the string column the payload bytes go to",
                                        path="parameters/payload_column"))
            special = set(parameters.special_columns())
            others = [c.name for c in stream.columns if c.required and c.name not in special]
            if others:
                errors.append(SpecError(f"format raw fills only the payload, subject and header columns; required "
                                        f"column(s) {', '.join(others)} would always be null",
                                        path="parameters/format"))
        errors += _partition_errors(parameters)
        errors += referenced_file_errors(base_dir, "credentials_file", parameters.credentials_file)
        if parameters.password_env is not None and parameters.user_env is None:
            errors.append(SpecError("password_env needs user_env", path="parameters/user_env"))
        return errors

    @classmethod
    def create(cls, source_id: str, parameters: Any, stream: StreamSpec, base_dir: Path) -> NatsSource:
        return cls(source_id, parameters, stream, base_dir)

    # -- LiveSource --------------------------------------------------------------------------

    async def start(self, position: int, source_state: bytes, until_caught_up: bool) -> None:
        """Connect (within ``connect_timeout``: a server that cannot be reached by then is an error;
        once connected, a lost connection is retried for ever), check the stream, and read from
        sequence ``position`` (0: its first message); with ``until_caught_up``, up to the stream's
        last sequence now. Raises :class:`NatsSourceError`."""
        import nats.errors
        import nats.js.errors
        from nats.aio.client import Client

        parameters = self.parameters
        self._position = position
        self._client = Client()
        try:
            await connect(self._client, [s.strip() for s in parameters.url.split(",")], parameters.connect_timeout,
                          label=f"{parameters.url} (nats source {self.source_id!r})", **self._credentials())
        except NatsUnreachableError as error:
            raise NatsSourceError(f"nats source {self.source_id!r}: cannot connect to {parameters.url} within "
                                  f"{parameters.connect_timeout:g} s ({error.cause}): start the server or fix "
                                  "parameters/url") from None
        self._js = self._client.jetstream()
        try:
            info = await self._js.stream_info(parameters.stream)
        except nats.js.errors.NotFoundError:
            raise NatsSourceError(f"nats source {self.source_id!r}: {parameters.url} has no JetStream stream "
                                  f"{parameters.stream!r}: create it (nats CLI: nats stream add; nats-py: "
                                  "await js.add_stream(name=..., subjects=[...])) or fix parameters/stream"
                                  ) from None
        except (TimeoutError, nats.errors.Error) as error:  # no JetStream on the server, or no answer
            raise NatsSourceError(f"nats source {self.source_id!r}: {parameters.url}: stream {parameters.stream!r}: "
                                  f"{error or type(error).__name__}") from None
        if until_caught_up:
            self._end = info.state.last_seq
        await self._subscribe()

    async def take(self, limit: int, wait: float) -> list[SourceRecord] | None:
        """Up to ``limit`` messages from the position on, waiting up to ``wait`` seconds for the first;
        while the connection is lost, ``[]`` after ``wait`` seconds (nothing is asked of the server)."""
        import nats.errors
        import nats.js.errors

        self.raise_held()
        if self._end is not None and (self._caught_up or self._position > self._end):
            return None
        assert self._client is not None
        if not self._client.is_connected:  # reconnecting: the reader sees a stop between two takes
            await self._clock.sleep(wait)
            return []
        try:
            if self._subscription is None:
                await self._subscribe()
            assert self._subscription is not None
            messages = await self._subscription.fetch(limit, timeout=wait)
        except TimeoutError:  # nats.errors.TimeoutError, or asyncio's from a fetch that found nothing
            return await self._nothing_fetched()
        except (nats.errors.Error, nats.js.errors.Error):
            self._subscription = None  # the consumer was lost (server restart, inactivity): make it again
            return []
        if messages:
            self._pending = messages[-1].metadata.num_pending
        records: list[SourceRecord] = []
        try:
            for message in messages:
                sequence = message.metadata.sequence.stream
                if self._end is not None and sequence > self._end:
                    self._caught_up = True
                    break
                try:
                    records.append(self._record(message, sequence))
                except SourceDataError as error:
                    self.bad_records.handle(error, f"nats stream {self.parameters.stream}", sequence,
                                            bytes(message.data))
                self._position = sequence + 1
        except SourceDataError as failure:  # on_bad_record: fail, at self._position
            return self.taken_before(records, failure)
        return records

    async def _nothing_fetched(self) -> list[SourceRecord] | None:
        """After a fetch that found nothing: ``None`` when caught up with the end (``until_caught_up``:
        nothing matching the filter is left before it), else ``[]``."""
        import nats.errors
        import nats.js.errors

        if self._subscription is None:  # the consumer was not made again in time: try with the next take
            return []
        self._pending = 0
        if self._end is None:
            return []
        try:
            info = await self._subscription.consumer_info()
        except (nats.errors.Error, nats.js.errors.Error):  # the connection or the consumer lost: ask again
            self._subscription = None
            return []
        if info.num_pending == 0:
            self._caught_up = True  # every earlier message is read
            return None
        return []

    def unread_records(self) -> int | None:
        """Exact (``egress.connectors.sources.unread``): the messages of the stream (matching the
        ``subject`` filter) after the last one fetched, as the server said with it (its
        ``num_pending``); 0 after a fetch that found none; ``None`` before the first fetch."""
        return self._pending

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await close_connection(client, self.parameters.url)

    # -- helpers ----------------------------------------------------------------------------

    def _credentials(self) -> dict[str, Any]:
        """The keyword arguments of ``nats.connect`` for the referenced credentials."""
        parameters = self.parameters
        found: dict[str, Any] = {}
        if parameters.credentials_file is not None:
            found["user_credentials"] = str(self._base_dir / parameters.credentials_file)
        if parameters.token_env is not None:
            found["token"] = self._environment(parameters.token_env, "token_env")
        if parameters.user_env is not None:
            found["user"] = self._environment(parameters.user_env, "user_env")
            if parameters.password_env is not None:
                found["password"] = self._environment(parameters.password_env, "password_env")
        return found

    def _environment(self, name: str, field: str) -> str:
        try:
            value = read_secret(env=name)
        except SecretUnavailable as error:
            raise NatsSourceError(f"nats source {self.source_id!r}: parameters/{field}: {error}: "
                                  "export it before egress run") from None
        assert value is not None  # env given
        return value

    async def _subscribe(self) -> None:
        """An ephemeral pull consumer from the position on (the position is the acknowledgement)."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        assert self._js is not None
        parameters = self.parameters
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, self._position),
                                ack_policy=AckPolicy.NONE, filter_subject=self._filter,
                                inactive_threshold=CONSUMER_INACTIVE_THRESHOLD, mem_storage=True, num_replicas=1)
        consumer = await self._js.add_consumer(parameters.stream, config)
        self._subscription = await self._js.pull_subscribe_bind(consumer.name, stream=parameters.stream)

    def _record(self, message: Msg, sequence: int) -> SourceRecord:
        """The row of ``message``; raises ``SourceDataError`` naming the stream and sequence."""
        parameters = self.parameters
        where = f"nats stream {parameters.stream} sequence {sequence}"
        if parameters.format == "json":
            row = json_row(message.data, self._json_columns, where)
        else:
            row = {c.name: None for c in self._json_columns}
        if parameters.payload_column is not None:
            row[parameters.payload_column] = bytes(message.data)
        if parameters.subject_column is not None:
            row[parameters.subject_column] = message.subject
        headers = message.headers or {}
        for name, header in parameters.header_columns.items():
            row[name] = headers.get(header)
        for column in self.stream.columns:
            if column.required and row.get(column.name) is None:
                raise record_error(where, column.name, "null in a required column")
        timestamp = None
        if parameters.timestamp_column is not None and row.get(parameters.timestamp_column) is not None:
            value = row[parameters.timestamp_column]
            try:
                timestamp = parse_timestamp(value)
            except ValueError as error:
                raise record_error(where, parameters.timestamp_column,
                                   f"cannot parse {value!r} as a timestamp ({error})") from None
        if tracing.active is not None and headers:  # the publisher's trace context, as a NATS header
            return SourceRecord(sequence, row, timestamp, 0, tracing.context_of_headers(
                headers.get(tracing.TRACEPARENT), headers.get(tracing.TRACESTATE)))
        return SourceRecord(sequence, row, timestamp)


def _partition_errors(parameters: NatsSourceParameters) -> list[SpecError]:
    """``readers`` above 1 needs a ``subject`` whose token ``{partition}`` tells the readers apart;
    the token is a whole token of the subject."""
    subject = parameters.subject
    example = "e.g. orders.{partition}.* over a stream that maps orders.* to orders.{{partition(N,1)}}.{{wildcard(1)}}"
    if subject is None:
        if parameters.readers > 1:
            return [SpecError(f"readers: {parameters.readers} needs a subject holding the token {PARTITION_TOKEN} "
                              f"({example}; docs/sources.md)", path="parameters/subject")]
        return []
    tokens = subject.split(".")
    if PARTITION_TOKEN in subject and (subject.count(PARTITION_TOKEN) > 1 or PARTITION_TOKEN not in tokens):
        return [SpecError(f"{PARTITION_TOKEN} must be one whole token of the subject, once ({example})",
                          path="parameters/subject")]
    if parameters.readers > 1 and PARTITION_TOKEN not in tokens:
        return [SpecError(f"readers: {parameters.readers} needs the token {PARTITION_TOKEN} in the subject, where "
                          f"the stream's partition number is ({example}; docs/sources.md)", path="parameters/subject")]
    return []
