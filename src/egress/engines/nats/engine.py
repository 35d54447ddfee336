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

from collections.abc import Sequence

from egress.clock import Clock
from egress.engines.nats.commits import NatsCommits
from egress.engines.nats.connection import COMPACTION_MARKERS
from egress.engines.nats.membership import NatsMembership
from egress.engines.nats.meta import NatsMeta


class NatsEngine(NatsCommits, NatsMeta, NatsMembership):
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
        super().__init__(servers, pipeline, bucket=bucket, replicas=replicas, owner=owner, lease_ttl=lease_ttl,
                         connect_timeout=connect_timeout, request_timeout=request_timeout,
                         retention_period=retention_period, outage_timeout=outage_timeout,
                         compaction_markers=compaction_markers, clock=clock)
