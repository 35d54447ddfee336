"""The files of a followed glob dealt among its readers by reader 0 (``egress.connectors.sources.shares``):
the choice by count then bytes, a reader waiting for its deal, deals kept across a restart, and the
dealer counting the files the other readers already follow."""

from __future__ import annotations

from pathlib import Path

import orjson

from egress.clock import VirtualClock
from egress.connectors.sources import JsonlSource
from egress.connectors.sources.files import FileSourceParameters
from egress.connectors.sources.follow import FollowedFiles
from egress.connectors.sources.shares import DEALT_KEPT, FETCH_PERIOD, FileShares, least_loaded
from egress.spec import StreamSpec

STREAM = StreamSpec.model_validate({"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                                    "group_by": ["id"]})


def jsonl(start: int, count: int) -> bytes:
    return b"".join(orjson.dumps({"id": i, "payload": f"p{i}"}) + b"\n" for i in range(start, start + count))


def reader(folder: Path, index: int, count: int) -> FollowedFiles:
    source = JsonlSource.create("logs", FileSourceParameters(path="*.jsonl", follow=True, readers=count), STREAM,
                                folder)
    assert isinstance(source, FollowedFiles)
    source.read_partition(index, count)
    return source


async def ids_taken(source: FollowedFiles) -> list[int]:
    """Every record ``source`` takes until caught up (or until a take finds nothing)."""
    ids: list[int] = []
    while (records := await source.take(1000, 0.0)):
        ids += [int(str(record.row["id"])) for record in records]
    return ids


def test_a_new_file_goes_to_the_reader_with_fewest_files_then_fewest_bytes_then_lowest_index() -> None:
    assert least_loaded([(2, 10), (1, 900), (1, 100)]) == 2
    assert least_loaded([(1, 100), (1, 100), (0, 5000)]) == 2
    assert least_loaded([(3, 7), (3, 7), (3, 7)]) == 0


def test_the_dealer_deals_by_count_and_size_and_keeps_a_deal_for_as_long_as_the_file_is_matched() -> None:
    shares = FileShares(0, 2)
    shares.begin({1: 500, 2: 10, 3: 10})
    assert [shares.mine(inode, size) for inode, size in [(1, 500), (2, 10), (3, 10)]] == [True, False, False]
    assert shares.dealt == {1: 0, 2: 1, 3: 1}  # 3: one file each, and reader 1's has fewer bytes
    shares.begin({1: 500, 2: 10, 3: 10, 4: 1})
    assert shares.mine(4, 1) is True  # reader 0 has 1 file, reader 1 has 2
    shares.begin({4: 1})  # 1, 2 and 3 gone: their deals stay (the newest DEALT_KEPT unmatched)
    assert shares.dealt == {1: 0, 2: 1, 3: 1, 4: 0}


def test_the_dealer_forgets_only_the_oldest_deals_of_files_no_longer_matched() -> None:
    shares = FileShares(0, 2)
    shares.begin({})
    for inode in range(DEALT_KEPT + 5):
        shares.mine(inode, 1)
    shares.begin({0: 1})
    assert 0 in shares.dealt
    assert len(shares.dealt) == DEALT_KEPT + 1
    assert all(inode in shares.dealt for inode in range(5, DEALT_KEPT + 5))


async def test_a_reader_takes_nothing_new_until_the_dealers_committed_state_gives_it_files(tmp_path: Path) -> None:
    for index in range(4):
        (tmp_path / f"f{index}.jsonl").write_bytes(jsonl(10 * index, 2))
    committed = b""

    async def reader_state(k: int) -> bytes:
        assert k == 0  # a reader other than the dealer loads the dealer's state only
        return committed

    clock = VirtualClock()
    second = reader(tmp_path, 1, 2)
    second.use_clock(clock)
    second.deal_from(reader_state)
    await second.start(0, b"", until_caught_up=True)
    assert await second.take(1000, 0.0) == []  # not None: files wait for their deal
    dealer = reader(tmp_path, 0, 2)
    await dealer.start(0, b"", until_caught_up=True)
    assert sorted(await ids_taken(dealer)) == [0, 1, 20, 21]
    committed = dealer.source_state
    await clock.advance(FETCH_PERIOD)  # the reader loads the dealer's state again at most this often
    assert sorted(await ids_taken(second)) == [10, 11, 30, 31]
    assert await second.take(1000, 0.0) is None
    await dealer.close()
    await second.close()


async def test_a_restarted_dealer_keeps_its_deals_and_deals_a_new_file_to_the_reader_with_fewest(
        tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(jsonl(0, 1))
    (tmp_path / "b.jsonl").write_bytes(jsonl(1, 1))
    (tmp_path / "c.jsonl").write_bytes(jsonl(2, 1))
    first = reader(tmp_path, 0, 2)
    await first.start(0, b"", until_caught_up=True)
    assert sorted(await ids_taken(first)) == [0, 2]  # a → 0, b → 1, c → 0
    state, position = first.source_state, first.position
    await first.close()
    inode = {name: (tmp_path / f"{name}.jsonl").stat().st_ino for name in "abc"}
    (tmp_path / "a.jsonl").rename(tmp_path / "z.jsonl")  # renamed: still reader 0's, sorted last now
    (tmp_path / "d.jsonl").write_bytes(jsonl(3, 1))
    again = reader(tmp_path, 0, 2)
    await again.start(position, state, until_caught_up=True)
    assert await ids_taken(again) == []  # d went to reader 1 (one file against two)
    dealt = dict(orjson.loads(again.source_state)["dealt"])
    d = (tmp_path / "d.jsonl").stat().st_ino
    assert {str(k): v for k, v in dealt.items()} == {str(inode["a"]): 0, str(inode["b"]): 1, str(inode["c"]): 0,
                                                     str(d): 1}
    await again.close()


async def test_the_dealer_leaves_the_files_another_reader_follows_to_it_and_counts_them(tmp_path: Path) -> None:
    for index in range(4):
        (tmp_path / f"f{index}.jsonl").write_bytes(jsonl(10 * index, 1))
    # Reader 1's committed state follows f0 and f1 (as one that chose by a hash of the inode may).
    other = JsonlSource.create("logs", FileSourceParameters(path="f[01].jsonl", follow=True), STREAM, tmp_path)
    assert isinstance(other, FollowedFiles)
    await other.start(0, b"", until_caught_up=True)
    assert sorted(await ids_taken(other)) == [0, 10]
    states = {1: other.source_state}

    async def reader_state(k: int) -> bytes:
        return states[k]

    dealer = reader(tmp_path, 0, 2)
    dealer.deal_from(reader_state)
    await dealer.start(0, b"", until_caught_up=True)
    assert sorted(await ids_taken(dealer)) == [20, 30]  # reader 1 has two: the next two are reader 0's
    inodes = [(tmp_path / f"f{index}.jsonl").stat().st_ino for index in range(4)]
    assert dict(orjson.loads(dealer.source_state)["dealt"]) == dict(zip(inodes, [1, 1, 0, 0], strict=True))
    await dealer.close()
    await other.close()
