"""The NATS engine's connection: its settings, opening it (the bucket's stream checked or created),
closing it, and the JetStream requests every role makes through it."""

from __future__ import annotations

import json
import os
import shlex
import socket
from collections.abc import Sequence

from nats.aio.client import Client
from nats.errors import Error as NatsClientError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.errors import ServiceUnavailableError as NoJetStreamError
from nats.js.kv import KeyValue

from egress.clock import Clock, RealClock
from egress.engines.nats.errors import NatsEngineError
from egress.engines.nats.jetstream import JetStream, Link
from egress.engines.nats.subjects import BUCKET_NAME, Layout, default_bucket
from egress.engines.protocols import StateLocation
from egress.errors import StateDirectoryError
from egress.nats_connections import NatsUnreachableError, close_connection, connect

LAYOUT_VERSION = 2  # 2: state and timer subjects per consumer partition and generation
MINIMUM_SERVER = (2, 12)  # atomic batch publish
COMPACTION_MARKERS = 1000
"""Delete markers a consumer partition's live generation may gather before a commit compacts it
(at least as many as the live keys it started with, so compaction costs O(1) writes per deletion)."""
_HEADER_ROOM = 8 * 1024  # of the server's max_payload, left for headers
DUPLICATE_WINDOW = 120.0
"""Seconds the stream remembers a ``Nats-Msg-Id`` (the server's default, set explicitly): a commit
sent again after a lost answer must reach the server within it, so ``outage_timeout`` plus
``request_timeout`` must stay below it."""


class NatsConnection:
    """The connection of an engine to its bucket on ``servers``; the settings are
    :class:`~egress.engines.nats.NatsEngine`'s."""

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
        self._clock = clock if clock is not None else RealClock()
        self._layout = Layout(self.bucket)
        self._connection: Client | None = None
        self._stream: JetStream | None = None
        self._kv: KeyValue | None = None
        self._budget = 0

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

    async def open(self, *, create: bool = True) -> None:
        """Connect and open the bucket, creating it or bringing its stream to this engine's settings;
        with ``create=False`` only a bucket that exists, left as it is (for deleting it): raises
        :class:`~egress.errors.StateDirectoryError` naming the bucket and the servers when there is
        none. Other errors: :class:`NatsEngineError` (see :class:`~egress.engines.nats.NatsEngine`)."""
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
            # Tried again while the answer is transient: on a cluster that has just formed, or while
            # another worker creates the same replicated stream, the stream has no leader yet for a
            # moment (no response from the stream, 503, a timeout); every step may run twice.
            self._kv = await self._stream.retrying(f"bucket {self.bucket}: open", lambda: self._open_bucket(js, create))
            await self._opened()
        except (NatsClientError, TimeoutError, OSError) as error:
            raise NatsEngineError(f"{self.url}: bucket {self.bucket}: {error or type(error).__name__}") from None

    async def _open_bucket(self, js: JetStreamContext, create: bool) -> KeyValue:
        """The bucket's stream created or brought to this engine's settings (``create``; otherwise
        only found), its KV handle, its meta key checked; raises :class:`NatsEngineError` when
        JetStream is off (not tried again)."""
        try:
            if create:
                await self._ensure_stream(js)
            else:
                await self._find_stream(js)
            kv = await js.key_value(self.bucket)
            await self._check_meta(kv, create)
        except NoJetStreamError:
            raise NatsEngineError(f"{self.url}: JetStream is not enabled on this server; start nats-server "
                                  "with -js (or jetstream {} in its configuration)") from None
        return kv

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

    async def _opened(self) -> None:
        """What a role does once the connection and the bucket are there, inside :meth:`open` (its
        errors are told as ``open()``'s)."""

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        self._stream = self._kv = None
        if connection is not None:
            await close_connection(connection, self.url)

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

    async def _find_stream(self, js: JetStreamContext) -> None:
        """Raise :class:`~egress.errors.StateDirectoryError` when the bucket's stream does not exist."""
        try:
            await js.stream_info(self._layout.stream)
        except NotFoundError:
            raise StateDirectoryError(f"{self.location.name}: no egress state here (no bucket {self.bucket} for "
                                      f"pipeline {self.pipeline!r}): check the pipeline name and the "
                                      "servers") from None

    async def _check_meta(self, kv: KeyValue, create: bool) -> None:
        """Write the bucket's meta key if it has none (``create``), or check that it is this
        pipeline's (and, when creating, of this engine's layout)."""
        if create:
            meta = json.dumps({"pipeline": self.pipeline, "layout": LAYOUT_VERSION}).encode()
            try:
                await kv.create(self._layout.meta_key, meta)
                return
            except KeyWrongLastSequenceError:
                pass
        try:
            found = json.loads((await kv.get(self._layout.meta_key)).value or b"{}")
        except KeyNotFoundError:
            return  # not creating: a bucket whose first open() stopped before it wrote its meta key
        if found.get("pipeline") != self.pipeline:
            raise NatsEngineError(f"{self.url}: bucket {self.bucket} belongs to pipeline {found.get('pipeline')!r}, "
                                  f"not {self.pipeline!r}; choose another bucket")
        if create and found.get("layout") != LAYOUT_VERSION:
            raise NatsEngineError(f"{self.url}: bucket {self.bucket} has layout version {found.get('layout')}, "
                                  f"not {LAYOUT_VERSION}, which this egress reads")

    def _js(self) -> JetStream:
        if self._stream is None:
            raise NatsEngineError(f"{self.url}: the engine is not open; call open() first")
        return self._stream
