"""Keys, partitions and message ids: the stable identities of messages.

A key is the tuple of a row's ``group_by`` values, encoded as compact JSON (``[..]``) so it is
readable in the state store. A ``bytes`` value (Flow's strings are byte strings) is the key of its
UTF-8 text, so ``b"JFK"`` and ``"JFK"`` are one key and decode as ``"JFK"``; bytes that are not
UTF-8 cannot be a key value. Its partition is ``blake2b(key) mod partition_count`` (stable across
processes and Python versions, unlike ``hash()``). A source message id is 20 bytes:
``blake2b(pipeline, source id, source identity)[:8] || source partition (u32 BE) || position (u64 BE)``;
a message a process
function emits while handling message ``m`` gets ``m.message_id || output index (u16 BE)``. Both are
deterministic, so a replayed batch produces the same ids, and the HTTP sink's idempotency key (the
upper-case hex of the id) is the same on every resend.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

import orjson

EMPTY_KEY = b"[]"
"""The stored form of the empty key ``()`` (a stream without ``group_by``)."""


_ONE_INTEGER_LOW, _ONE_INTEGER_HIGH = -(1 << 63), 1 << 64
"""The integers (``low <= value < high``) whose one-integer key ``encode_key`` writes as ``[digits]``
itself: orjson's range, so the same bytes as its compact JSON."""


def encode_key(values: Sequence[Any]) -> bytes:
    """The stored form of a key: compact JSON of its values in ``group_by`` order, ``bytes`` as
    their UTF-8 text. Raises ``TypeError`` saying why for a value that cannot be a key (bytes that
    are not UTF-8, a type JSON cannot hold)."""
    if len(values) == 1 and type(values[0]) is int and _ONE_INTEGER_LOW <= values[0] < _ONE_INTEGER_HIGH:
        # One integer (the common key): its decimal digits are its compact JSON, as orjson writes it.
        return b"[%d]" % values[0]
    if not values:
        return EMPTY_KEY
    try:
        # A right-sized copy: keys are kept in memory, and measured here each result of orjson 3.13
        # keeps a ~4 KiB allocation alive (100,000 small keys: 410 MB).
        return bytes(memoryview(orjson.dumps(list(values), default=_bytes_as_text)))
    except TypeError as error:
        raise TypeError(str(error.__cause__ or error)) from None


def encode_keys(rows: Sequence[Mapping[str, Any]], group_by: Sequence[str]) -> list[bytes]:
    """:func:`encode_key` of each row's ``group_by`` values, in one pass over a batch (a source's
    chunk); raises ``TypeError`` as :func:`encode_key` does. ``rows`` must hold every ``group_by`` column."""
    if not group_by:
        return [EMPTY_KEY] * len(rows)
    if len(group_by) > 1:
        values_of = itemgetter(*group_by)
        return [encode_key(values_of(row)) for row in rows]
    column = group_by[0]
    values = [row[column] for row in rows]
    if values and set(map(type, values)) == {int} and min(values) >= _ONE_INTEGER_LOW \
            and max(values) < _ONE_INTEGER_HIGH:
        return [b"[%d]" % value for value in values]  # encode_key's one-integer form, for the whole batch
    return [encode_key((value,)) for value in values]


def _bytes_as_text(value: Any) -> str:
    """orjson's ``default`` hook for key values: ``bytes`` become their UTF-8 text."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError as error:
            raise TypeError(f"a key value must be text; these bytes are not UTF-8 ({error})") from None
    raise TypeError(f"a key value cannot be of type {type(value).__name__}")


def decode_key(encoded: bytes) -> tuple[Any, ...]:
    """The values of a key :func:`encode_key` stored, as a tuple."""
    digits = encoded[1:-1]
    if digits.isdigit() or (digits[:1] == b"-" and digits[1:].isdigit()):
        return (int(digits),)  # one integer (what encode_key writes without the JSON encoder)
    return tuple(orjson.loads(encoded))


_BLAKE2B_8 = hashlib.blake2b(digest_size=8)
"""The empty 8-byte BLAKE2b state :func:`partition_of` copies per key (cheaper than making one)."""


def partition_of(encoded_key: bytes, partition_count: int) -> int:
    """The partition (``0 .. partition_count-1``) that owns ``encoded_key``."""
    if partition_count == 1:
        return 0
    hasher = _BLAKE2B_8.copy()
    hasher.update(encoded_key)
    digest = hasher.digest()
    if 256 % partition_count == 0:  # then the digest's value mod the count is its last byte's
        return digest[7] % partition_count
    return int.from_bytes(digest, "big") % partition_count


def key_in_partition(values: Sequence[Any], partition: int, partition_count: int) -> bytes:
    """The first ``encode_key([*values, i])``, i = 0, 1, …, that :func:`partition_of` gives to
    ``partition``: a key for an entry that must load back with a partition's share of keyed state
    (engines load it by each key's partition). About ``partition_count`` hashes on average."""
    salt = 0
    while partition_of(key := encode_key([*values, salt]), partition_count) != partition:
        salt += 1
    return key


def partitions_of(encoded_keys: Iterable[bytes], partition_count: int) -> list[int]:
    """:func:`partition_of` of each of ``encoded_keys`` (a source's chunk)."""
    return [partition_of(key, partition_count) for key in encoded_keys]


def source_scope(pipeline: str, source_id: str, identity: str = "") -> str:
    """What a source's message ids are unique within: the pipeline, the source and what it reads
    (a file source's ``path``). Two pipelines, or one pipeline pointed at another file, never share
    idempotency keys, so a receiver that deduplicates on them cannot drop a real message."""
    return "\x1f".join((pipeline, source_id, identity))


def source_message_id(scope: str, source_partition: int, position: int) -> bytes:
    """The 20-byte id of the record at ``position`` of a source's partition, ``scope`` from
    :func:`source_scope`: ``blake2b(scope)[:8] || source partition (u32 BE) || position (u64 BE)``."""
    return source_message_id_prefix(scope, source_partition) + position.to_bytes(8, "big")


def source_message_ids(scope: str, source_partition: int, positions: Iterable[int]) -> list[bytes]:
    """:func:`source_message_id` of each of ``positions`` (a source's chunk), the prefix computed once."""
    prefix = source_message_id_prefix(scope, source_partition)
    return [prefix + position.to_bytes(8, "big") for position in positions]


@functools.lru_cache(maxsize=256)
def source_message_id_prefix(scope: str, source_partition: int) -> bytes:
    """The first 12 bytes of every id of a source's partition (:func:`source_message_id`), which a
    reader computes once: ``blake2b(scope)[:8] || source partition (u32 BE)``."""
    return hashlib.blake2b(scope.encode(), digest_size=8).digest() + source_partition.to_bytes(4, "big")


_OUTPUT_INDEXES = [index.to_bytes(2, "big") for index in range(256)]


def derived_message_id(parent: bytes, index: int) -> bytes:
    """The id of output number ``index`` (0-based, < 65536) emitted while handling ``parent``."""
    if 0 <= index < 256:
        return parent + _OUTPUT_INDEXES[index]
    if not 0 <= index < 65536:
        raise ValueError(f"a process function may emit at most 65536 messages per input, got index {index}")
    return parent + index.to_bytes(2, "big")


def idempotency_key(message_id: bytes) -> str:
    """Upper-case hex of the raw id bytes (upstream: ``"message\\n\\0"`` → ``6D6573736167650A00``)."""
    return message_id.hex().upper()
