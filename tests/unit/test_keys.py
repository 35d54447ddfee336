from egress.keys import (
    decode_key,
    derived_message_id,
    encode_key,
    idempotency_key,
    key_in_partition,
    partition_of,
    source_message_id,
    source_scope,
)

FIRST_ID = "eb31c86cf42f872e000000000000000000000000"


def test_idempotency_key_is_upper_case_hex_of_the_raw_id_bytes() -> None:
    # The upstream sink test AddsStableConfigurableIdempotencyHeader uses this id.
    assert idempotency_key(b"message\n\0") == "6D6573736167650A00"


def test_source_message_ids_are_stable_and_distinct_per_position() -> None:
    scope = source_scope("flights_to_webhook", "flights_csv", "data/flights-2013-01.csv.gz")
    first = source_message_id(scope, 0, 0)
    assert first == source_message_id(scope, 0, 0)
    assert first.hex() == FIRST_ID  # fixed: idempotency keys must not change between versions
    assert len({source_message_id(scope, 0, p) for p in range(1000)}) == 1000


def test_ids_differ_between_pipelines_sources_and_files() -> None:
    """Two pipelines (or one pointed at another file) must never share idempotency keys: a receiver
    that deduplicates on them would drop real messages."""
    scopes = [source_scope("jan_a", "flights_csv", "jan.csv"), source_scope("jan_b", "flights_csv", "jan.csv"),
              source_scope("jan_a", "other_csv", "jan.csv"), source_scope("jan_a", "flights_csv", "feb.csv")]
    assert len({source_message_id(scope, 0, 0) for scope in scopes}) == 4


def test_message_ids_of_one_source_sort_in_position_order() -> None:
    ids = [source_message_id("s", 0, p) for p in (0, 1, 255, 256, 70000)]
    assert ids == sorted(ids)


def test_derived_ids_extend_the_parent_id() -> None:
    parent = source_message_id("s", 0, 5)
    assert derived_message_id(parent, 1) == parent + b"\x00\x01"


def test_keys_round_trip_and_partition_stably() -> None:
    key = encode_key(["JFK", 3])
    assert decode_key(key) == ("JFK", 3)
    # Fixed expectation: partitioning must not change between versions (committed state would move).
    assert [partition_of(encode_key([o]), 4) for o in ("EWR", "JFK", "LGA")] == [0, 2, 1]
    assert partition_of(key, 1) == 0
    assert {partition_of(encode_key([i]), 8) for i in range(200)} == set(range(8))


def test_keys_kept_in_memory_are_right_sized() -> None:
    """orjson's results each keep a ~4 KiB allocation alive; keys live in memory for a whole epoch."""
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        keys = [encode_key(["N12345", i]) for i in range(20_000)]
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(keys) == 20_000
    assert used < 20_000 * 200  # a right-sized key is ~60 bytes with its object header


def test_a_bytes_key_value_is_the_key_of_its_utf8_text() -> None:
    """Flow's strings are byte strings: ``b"JFK"`` and ``"JFK"`` are one key (same partition, same state)."""
    assert encode_key([b"JFK", 1]) == encode_key(["JFK", 1]) == b'["JFK",1]'
    assert encode_key([b"caf\xc3\xa9"]) == encode_key(["caf\u00e9"])
    assert decode_key(encode_key([b"JFK"])) == ("JFK",)


def test_bytes_that_are_not_utf8_cannot_be_a_key_value_and_say_why() -> None:
    import pytest

    with pytest.raises(TypeError, match="a key value must be text; these bytes are not UTF-8"):
        encode_key([b"\xff"])
    with pytest.raises(TypeError, match="a key value cannot be of type object"):
        encode_key([object()])


def test_an_integer_key_is_stored_exactly_as_the_json_encoder_writes_it() -> None:
    """One integer is the common key: it is written without the JSON encoder, byte for byte the same."""
    import orjson
    import pytest

    from egress.keys import decode_key, encode_key

    for value in (0, 1, -1, 7, 10**18, -(2**63), 2**63 - 1, 2**64 - 1):
        assert encode_key([value]) == orjson.dumps([value])
        assert encode_key((value,)) == orjson.dumps([value])
        assert decode_key(encode_key([value])) == (value,)
    for values in ([], ["-"], ["12"], [1, 2], [-1.5], [None], [True]):
        assert decode_key(encode_key(values)) == tuple(values)
    assert encode_key([True]) == b"[true]"  # a bool is no integer key
    assert encode_key([]) == encode_key(()) == b"[]"
    with pytest.raises(TypeError):
        encode_key([2**64])


def test_the_batch_forms_give_the_keys_partitions_and_ids_of_the_one_at_a_time_forms() -> None:
    """A source reader keys a chunk at a time (``encode_keys``, ``partitions_of``, ``source_message_ids``):
    the same bytes and partitions as one record at a time, for every key shape and partition count."""
    import pytest

    from egress.keys import encode_keys, partitions_of, source_message_ids

    rows = [{"id": i, "origin": origin, "big": big}
            for i, (origin, big) in enumerate([("EWR", 2**64 - 1), ("JFK", -(2**63)), (None, True), ("LGA", 1.5)] * 50)]
    for group_by in ([], ["id"], ["origin"], ["big"], ["origin", "id"]):
        keys = encode_keys(rows, group_by)
        assert keys == [encode_key([row[c] for c in group_by]) for row in rows]
        for count in (1, 2, 3, 4, 7, 8, 256, 1000):
            assert partitions_of(keys, count) == [partition_of(key, count) for key in keys]
    with pytest.raises(TypeError, match="Integer exceeds 64-bit range"):  # as encode_key([2**64])
        encode_keys([{"id": 1}, {"id": 2**64}], ["id"])
    positions = [0, 1, 255, 70_000, 2**40]
    assert source_message_ids("s", 3, positions) == [source_message_id("s", 3, p) for p in positions]


def test_key_in_partition_is_the_first_salted_key_that_hashes_to_the_partition() -> None:
    for count in (2, 3, 7):
        for partition in range(count):
            key = key_in_partition(["k"], partition, count)
            assert partition_of(key, count) == partition
            salt = decode_key(key)[1]
            assert key == encode_key(["k", salt])
            assert all(partition_of(encode_key(["k", earlier]), count) != partition for earlier in range(salt))
    assert key_in_partition([], 0, 1) == encode_key([0])
