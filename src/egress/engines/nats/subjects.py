"""Where the NATS engine keeps what: one KV bucket per pipeline, one subject per record.

Everything of a pipeline lives in one JetStream stream, the KV bucket ``<bucket>`` (stream
``KV_<bucket>``, subjects ``$KV.<bucket>.>``), because an atomic batch covers one stream only and a
commit touches leases, checkpoints, the log, the outbox and state together. The stream keeps one
message per subject (``max_msgs_per_subject: 1``), so a subject is a key with its latest value:

====================================================  =============================================
subject after ``$KV.<bucket>.``                       holds
====================================================  =============================================
``meta``                                              the pipeline the bucket belongs to (JSON)
``metadata.<name>``                                   a metadata value of the pipeline (UTF-8)
``lease.<consumer>.<partition>``                      the lease (JSON), with a per-message TTL when
                                                      taken by ``try_acquire``; the revision taking
                                                      it is the generation, a renewal's the fence
``member.<worker id>``                                a live cluster member (JSON), per-message TTL
``checkpoint.<consumer>.<partition>``                 positions, sink progress, outbox seqs, watermark
``log.<stream>.<partition>.<first offset>``           a chunk of log messages from that offset on
``outbox.<consumer>.<partition>.<first seq>``         a chunk of outbox messages from that seq on
``state.<consumer>.<partition>.<gen>.<name>.<key>``   one key of a computation partition's state,
                                                      in generation ``<gen>`` (the checkpoint names
                                                      the live one)
``external.<table>.<key>``                            one row of an external state table
``timer.<consumer>.<partition>.<gen>.<domain>.<key>.<at>``  one pending timer, in generation ``<gen>``
``redo.<consumer>.<partition>.<n>``                   keyed writes of a commit too big for one batch
``tracelog.<stream>.<partition>.<first offset>``      trace contexts of a commit's log appends there
                                                      (offset → context; tracing on only)
``traceoutbox.<consumer>.<partition>.<first seq>``    trace contexts of a commit's outbox (seq → context)
====================================================  =============================================

Names (consumers, streams, tables, state names, domains) are used as they are when they are
made of ``A-Z a-z 0-9 _ -`` (at most 64), else as ``=`` + their UTF-8 in unpadded base64url; keys
are ``k`` + base64url of the encoded key, or ``h`` + a BLAKE2b digest when that would exceed 128
characters (the record carries the key itself). Every token stays within the KV key alphabet, so
``nats kv get <bucket> lease.deliver.0`` works.

Beside the stream, core NATS subject ``egress.appends.<bucket>`` (not stored) carries a note after
each commit with log appends: which ``(stream, partition)`` slots grew (:meth:`Layout.appends`).
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KEY_TOKEN_BYTES = 96  # base64url of 96 bytes is 128 characters
BUCKET_NAME = re.compile(r"[A-Za-z0-9_-]+")


def name_token(name: str) -> str:
    """The subject token of a name: itself when plain, else ``=`` + base64url (never ambiguous:
    a plain name never starts with ``=``)."""
    if _PLAIN_NAME.fullmatch(name):
        return name
    return "=" + _base64url(name.encode())


def name_of_token(token: str) -> str:
    """The name a :func:`name_token` stands for."""
    if not token.startswith("="):
        return token
    return base64.urlsafe_b64decode(token[1:] + "=" * (-len(token[1:]) % 4)).decode()


def key_token(key: bytes) -> str:
    """The subject token of an encoded key (``k`` + base64url, or ``h`` + digest when long)."""
    if len(key) <= _KEY_TOKEN_BYTES:
        return "k" + _base64url(key)
    return "h" + hashlib.blake2b(key, digest_size=20).hexdigest()


def trigger_token(trigger: float) -> str:
    """A timer's trigger time as a token: the 16 hex digits of the IEEE 754 double."""
    return struct.pack(">d", trigger).hex()


def default_bucket(pipeline: str) -> str:
    """The bucket of ``pipeline``: ``egress_<pipeline>`` when the name is plain, else a digest."""
    if _PLAIN_NAME.fullmatch(pipeline):
        return f"egress_{pipeline}"
    return "egress_" + hashlib.blake2b(pipeline.encode(), digest_size=10).hexdigest()


def _base64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Layout:
    """The subjects of one bucket. Methods give full subjects (``$KV.<bucket>.…``) unless named
    ``*_key`` (a KV key, without the prefix); ``*s`` methods give wildcard filters."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        self.prefix = f"$KV.{bucket}."

    def suffix(self, subject: str) -> str:
        """``subject`` without the bucket's prefix."""
        return subject[len(self.prefix):]

    meta_key = "meta"

    def metadata_key(self, name: str) -> str:
        return f"metadata.{name_token(name)}"

    def all_log_chunks(self) -> str:
        return f"{self.prefix}log.>"

    def all_outbox_chunks(self) -> str:
        return f"{self.prefix}outbox.>"

    def all_timers(self) -> str:
        return f"{self.prefix}timer.>"

    def owner_of(self, subject: str) -> tuple[str, int]:
        """The ``(name, partition)`` of a ``lease``, ``checkpoint``, ``log``, ``outbox``, ``timer`` or
        ``redo`` subject (its second and third tokens)."""
        _, name, partition = self.suffix(subject).split(".", 3)[:3]
        return name_of_token(name), int(partition)

    def lease_key(self, consumer: str, partition: int) -> str:
        return f"lease.{name_token(consumer)}.{partition}"

    def lease(self, consumer: str, partition: int) -> str:
        return self.prefix + self.lease_key(consumer, partition)

    def leases(self) -> str:
        return f"{self.prefix}lease.>"

    def member_key(self, worker_id: str) -> str:
        return f"member.{name_token(worker_id)}"

    def member(self, worker_id: str) -> str:
        return self.prefix + self.member_key(worker_id)

    def members(self) -> str:
        return f"{self.prefix}member.>"

    @property
    def appends(self) -> str:
        """The core NATS subject (outside the stream) of the bucket's append notifications."""
        return f"egress.appends.{self.bucket}"

    def checkpoint(self, consumer: str, partition: int) -> str:
        return f"{self.prefix}checkpoint.{name_token(consumer)}.{partition}"

    def checkpoints(self) -> str:
        return f"{self.prefix}checkpoint.>"

    def log_chunk(self, stream: str, partition: int, first: int) -> str:
        return f"{self.prefix}log.{name_token(stream)}.{partition}.{first}"

    def log_chunks(self, stream: str, partition: int) -> str:
        return f"{self.prefix}log.{name_token(stream)}.{partition}.*"

    def outbox_chunk(self, consumer: str, partition: int, first: int) -> str:
        return f"{self.prefix}outbox.{name_token(consumer)}.{partition}.{first}"

    def outbox_chunks(self, consumer: str, partition: int) -> str:
        return f"{self.prefix}outbox.{name_token(consumer)}.{partition}.*"

    def state(self, consumer: str, partition: int, generation: int, name: str, key: bytes) -> str:
        return (f"{self.prefix}state.{name_token(consumer)}.{partition}.{generation}.{name_token(name)}."
                f"{key_token(key)}")

    def states(self, consumer: str, partition: int, generation: int | None = None) -> str:
        """The state subjects of a consumer partition: of ``generation``, or of every generation."""
        tail = ">" if generation is None else f"{generation}.>"
        return f"{self.prefix}state.{name_token(consumer)}.{partition}.{tail}"

    def external(self, table: str, key: bytes) -> str:
        return f"{self.prefix}external.{name_token(table)}.{key_token(key)}"

    def externals(self, table: str) -> str:
        return f"{self.prefix}external.{name_token(table)}.>"

    def timer(self, consumer: str, partition: int, generation: int, key: bytes, trigger: float,
              domain: str) -> str:
        return (f"{self.prefix}timer.{name_token(consumer)}.{partition}.{generation}.{name_token(domain)}."
                f"{key_token(key)}.{trigger_token(trigger)}")

    def timers(self, consumer: str, partition: int, generation: int | None = None) -> str:
        """The timer subjects of a consumer partition: of ``generation``, or of every generation."""
        tail = ">" if generation is None else f"{generation}.>"
        return f"{self.prefix}timer.{name_token(consumer)}.{partition}.{tail}"

    def generation_of(self, subject: str) -> int:
        """The generation of a ``state`` or ``timer`` subject (its fourth token)."""
        return int(self.suffix(subject).split(".", 4)[3])

    def in_generation(self, subject: str, generation: int) -> str:
        """A ``state`` or ``timer`` subject moved to ``generation``."""
        kind, consumer, partition, _, rest = self.suffix(subject).split(".", 4)
        return f"{self.prefix}{kind}.{consumer}.{partition}.{generation}.{rest}"

    def log_trace(self, stream: str, partition: int, first: int) -> str:
        return f"{self.prefix}tracelog.{name_token(stream)}.{partition}.{first}"

    def log_traces(self, stream: str, partition: int) -> str:
        return f"{self.prefix}tracelog.{name_token(stream)}.{partition}.*"

    def outbox_trace(self, consumer: str, partition: int, first: int) -> str:
        return f"{self.prefix}traceoutbox.{name_token(consumer)}.{partition}.{first}"

    def outbox_traces(self, consumer: str, partition: int) -> str:
        return f"{self.prefix}traceoutbox.{name_token(consumer)}.{partition}.*"

    def redo(self, consumer: str, partition: int, index: int) -> str:
        return f"{self.prefix}redo.{name_token(consumer)}.{partition}.{index}"

    def redos(self, consumer: str, partition: int) -> str:
        return f"{self.prefix}redo.{name_token(consumer)}.{partition}.*"

    def all_redos(self) -> str:
        return f"{self.prefix}redo.>"
