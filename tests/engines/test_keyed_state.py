"""Conformance, ``load_keyed_state``: a partition job loads only its partition's share."""

from __future__ import annotations

from egress.engines import Engine, EpochCommit, KeyedState
from egress.keys import encode_key, partition_of

PARTITIONS = 4


def keys_by_partition() -> dict[int, list[bytes]]:
    keys: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for i in range(40):
        key = encode_key([f"user{i}"])
        keys[partition_of(key, PARTITIONS)].append(key)
    assert all(keys.values()), "every partition needs keys for this test"
    return keys


async def commit_partition(engine: Engine, consumer: str, partition: int, keys: list[bytes], tag: bytes) -> None:
    generation = await engine.acquire(consumer, partition)
    await engine.commit(EpochCommit(
        consumer, partition, generation,
        state_writes={("counts", key): tag + key for key in keys},
        external_state_writes={**{("profiles", key): tag + key for key in keys},
                               **{("secrets", key): b"s" for key in keys}},
        timers_set=[(key, 10.0 + partition, "processing") for key in keys] + [(keys[0], 99.0, "event")],
        watermark=100.0 + partition))


async def test_keyed_state_is_loaded_only_for_the_keys_of_the_requested_partition(engine: Engine) -> None:
    keys = keys_by_partition()
    for partition, mine in keys.items():
        await commit_partition(engine, "c", partition, mine, b"c:")
        await commit_partition(engine, "other", partition, mine, b"other:")
    for partition, mine in keys.items():
        keyed = await engine.load_keyed_state("c", partition, PARTITIONS, ["profiles"])
        assert keyed.internal == {"counts": {key: b"c:" + key for key in mine}}
        # only the tables asked for; they are named by the user and shared between computations,
        # so "other" (committed last) wrote the rows both see
        assert keyed.external == {"profiles": {key: b"other:" + key for key in mine}}
        assert sorted(keyed.timers) == sorted([(key, 10.0 + partition, "processing") for key in mine]
                                              + [(mine[0], 99.0, "event")])
        assert keyed.watermark == 100.0 + partition


async def test_keyed_state_of_a_partition_never_committed_is_empty(engine: Engine) -> None:
    keys = keys_by_partition()
    await commit_partition(engine, "c", 0, keys[0], b"c:")
    keyed = await engine.load_keyed_state("c", 1, PARTITIONS, ["profiles"])
    assert (keyed.internal, keyed.external.get("profiles", {}), keyed.timers, keyed.watermark) == ({}, {}, [], None)
    assert await engine.load_keyed_state("fresh", 0, PARTITIONS, []) == KeyedState({}, {}, [], None)
