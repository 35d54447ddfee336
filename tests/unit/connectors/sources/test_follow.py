"""Following files (``follow: true``): growth, partial lines, rotation by inode, globs, truncation,
and resuming each file at its committed byte after a restart."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest

from egress.clock import VirtualClock
from egress.connectors.base import LiveSource, SourceRecord
from egress.connectors.sources import CsvSource, JsonlSource
from egress.connectors.sources.files import CsvSourceParameters, FileSourceParameters
from egress.connectors.sources.follow import IDLE_WAIT_MAX, FollowedFiles
from egress.errors import SourceChangedError, SourceDataError
from egress.spec import StreamSpec
from tests.live_source_support import assert_an_idle_take_waits_on_the_clock
from tests.waiting import eventually

STREAM = StreamSpec.model_validate({"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                                    "group_by": ["id"]})


def jsonl(start: int, count: int) -> bytes:
    return b"".join(orjson.dumps({"id": i, "payload": f"p{i}"}) + b"\n" for i in range(start, start + count))


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as file:
        file.write(data)


def rotate_while_writing(path: Path, rotated: Path, *, old_tail: bytes, new: bytes) -> None:
    """Rename ``path`` to ``rotated`` and begin a new file there while a writer still holds the old
    one and appends ``old_tail`` to it after the rotation."""
    with open(path, "ab") as writer:
        os.rename(path, rotated)
        path.write_bytes(new)
        writer.write(old_tail)


def followed(tmp_path: Path, path: str = "app.jsonl") -> FollowedFiles:
    source = JsonlSource.create("logs", FileSourceParameters(path=path, follow=True), STREAM, tmp_path)
    assert isinstance(source, FollowedFiles)
    assert isinstance(source, LiveSource)
    return source


async def take_all(source: FollowedFiles) -> list[SourceRecord]:
    """Every record available now (passes until one finds nothing new)."""
    taken: list[SourceRecord] = []
    while True:
        records = await source.take(1000, 0.0)
        if records is None:
            return taken
        taken += records


def ids(records: list[SourceRecord]) -> list[int]:
    return [r.row["id"] for r in records]


async def test_a_growing_file_is_read_as_it_grows_and_a_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "app.jsonl"
    path.write_bytes(jsonl(0, 3) + b'{"id": 3, "pay')
    source = followed(tmp_path)
    await source.start(0, b"", until_caught_up=True)
    assert ids(await take_all(source)) == [0, 1, 2]
    append(path, b'load": "p3"}\n' + jsonl(4, 1))
    records = await take_all(source)
    assert ids(records) == [3, 4]
    assert [(r.source_partition, r.position) for r in records] == [(0, 3), (0, 4)]
    await source.close()


async def test_a_rotated_file_is_read_to_its_end_before_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "app.jsonl"
    path.write_bytes(jsonl(0, 2))
    source = followed(tmp_path)
    await source.start(0, b"", until_caught_up=True)
    assert ids(await take_all(source)) == [0, 1]
    rotate_while_writing(path, tmp_path / "app.jsonl.1", old_tail=jsonl(2, 2), new=jsonl(10, 2))
    records = await take_all(source)
    assert ids(records) == [2, 3, 10, 11]
    assert [(r.source_partition, r.position) for r in records] == [(0, 2), (0, 3), (1, 0), (1, 1)]
    await source.close()


async def test_a_glob_picks_up_new_files_and_a_renamed_file_stays_the_same_file(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(jsonl(0, 1))
    source = followed(tmp_path, "*.jsonl")
    await source.start(0, b"", until_caught_up=True)
    assert ids(await take_all(source)) == [0]
    (tmp_path / "b.jsonl").write_bytes(jsonl(1, 1))
    os.rename(tmp_path / "a.jsonl", tmp_path / "a-old.jsonl")  # still matched: not a new file
    append(tmp_path / "a-old.jsonl", jsonl(2, 1))
    records = await take_all(source)
    assert sorted((r.source_partition, r.position, r.row["id"]) for r in records) == [(0, 1, 2), (1, 0, 1)]
    await source.close()


async def test_a_file_truncated_in_place_is_read_from_its_start_as_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "app.jsonl"
    path.write_bytes(jsonl(0, 3))
    source = followed(tmp_path)
    await source.start(0, b"", until_caught_up=True)
    assert len(await take_all(source)) == 3
    os.truncate(path, 0)
    append(path, jsonl(100, 1))
    records = await take_all(source)
    assert [(r.source_partition, r.position, r.row["id"]) for r in records] == [(1, 0, 100)]
    await source.close()


async def test_a_restart_resumes_each_file_at_its_byte_and_finds_a_file_rotated_while_down(tmp_path: Path) -> None:
    path = tmp_path / "app.jsonl"
    path.write_bytes(jsonl(0, 2))
    first = followed(tmp_path)
    await first.start(0, b"", until_caught_up=True)
    assert len(await take_all(first)) == 2
    state, position = first.source_state, first.position
    await first.close()
    append(path, jsonl(2, 1))  # while egress is down: appended, rotated, and a new file begun
    os.rename(path, tmp_path / "app.jsonl.1")
    path.write_bytes(jsonl(10, 1))
    second = followed(tmp_path)
    await second.start(position, state, until_caught_up=True)
    records = await take_all(second)
    assert [(r.source_partition, r.position, r.row["id"]) for r in records] == [(0, 2, 2), (1, 0, 10)]
    await second.close()


async def test_the_committed_state_names_each_file_by_all_its_fields(tmp_path: Path) -> None:
    """The state a restart resumes from (written without dataclasses.asdict): every field of each
    followed file, the CSV header included, under its name."""
    (tmp_path / "a.csv").write_text("id,payload\n1,x\n")
    source = CsvSource.create("logs", CsvSourceParameters(path="*.csv", follow=True), STREAM, tmp_path)
    await source.start(0, b"", until_caught_up=True)
    await take_all(source)
    [entry] = orjson.loads(source.source_state)["files"]
    inode = (tmp_path / "a.csv").stat().st_ino
    assert {key: entry[key] for key in ("number", "path", "inode", "offset", "records", "lines", "header")} == {
        "number": 0, "path": str(tmp_path / "a.csv"), "inode": inode, "offset": 15, "records": 1, "lines": 2,
        "header": ["id", "payload"]}
    assert set(entry) == {"number", "path", "inode", "length", "fingerprint", "offset", "records", "lines", "header"}
    await source.close()


async def test_each_followed_csv_file_has_its_own_header(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("id,payload\n1,x\n")
    (tmp_path / "b.csv").write_text("payload,id\ny,2\n")
    source = CsvSource.create("logs", CsvSourceParameters(path="*.csv", follow=True), STREAM, tmp_path)
    await source.start(0, b"", until_caught_up=True)
    records = await take_all(source)
    assert [(r.source_partition, r.position, r.row) for r in records] == [
        (0, 0, {"id": 1, "payload": "x"}), (1, 0, {"id": 2, "payload": "y"})]
    await source.close()


def test_a_followed_path_may_not_exist_yet_but_its_folder_must_and_it_must_not_be_compressed(tmp_path: Path) -> None:
    assert JsonlSource.check(FileSourceParameters(path="later.jsonl", follow=True), STREAM, tmp_path) == []
    errors = JsonlSource.check(FileSourceParameters(path="nowhere/app.jsonl.gz", follow=True), STREAM, tmp_path)
    assert [(e.path, e.message.split(":")[0]) for e in errors] == [
        ("parameters/follow", "follow"), ("parameters/path", "folder not found")]


async def test_a_source_read_without_follow_is_not_resumed_as_a_followed_one(tmp_path: Path) -> None:
    (tmp_path / "app.jsonl").write_bytes(jsonl(0, 3))
    one_shot = JsonlSource.create("logs", FileSourceParameters(path="app.jsonl"), STREAM, tmp_path)
    assert len(list(one_shot.records(0))) == 3
    source = followed(tmp_path)
    with pytest.raises(SourceChangedError, match=r"was read without follow: true.*new state directory"):
        await source.start(3, one_shot.source_state, until_caught_up=True)


async def test_a_bad_line_of_a_followed_file_is_dead_lettered_and_takes_its_record_number(tmp_path: Path) -> None:
    (tmp_path / "app.jsonl").write_bytes(jsonl(0, 1) + b"{oops\n" + jsonl(2, 1))
    parameters = FileSourceParameters(path="app.jsonl", follow=True, on_bad_record="dead_letter",
                                      dead_letter_path="bad.jsonl")
    source = JsonlSource.create("logs", parameters, STREAM, tmp_path)
    await source.start(0, b"", until_caught_up=True)
    records = await take_all(source)
    assert [(r.position, r.row["id"]) for r in records] == [(0, 0), (2, 2)]
    letter = orjson.loads((tmp_path / "bad.jsonl").read_bytes())
    assert (letter["position"], letter["record"]) == (1, "{oops\n")
    assert source.bad_records.dead_lettered == 1
    await source.close()


async def test_a_bad_line_under_fail_lets_the_lines_before_it_be_taken_and_the_next_take_fails_at_it(
        tmp_path: Path) -> None:
    (tmp_path / "app.jsonl").write_bytes(jsonl(0, 2) + b"{oops\n" + jsonl(3, 1))
    source = followed(tmp_path)
    await source.start(0, b"", until_caught_up=True)
    records = await source.take(1000, 0.0)
    assert records is not None
    assert ids(records) == [0, 1]
    state, position = source.source_state, source.position  # what the reader commits with them
    with pytest.raises(SourceDataError, match=r"app.jsonl:3: not valid JSON"):
        await source.take(1000, 0.0)
    await source.close()
    resumed = followed(tmp_path)  # from the committed state: at the bad line, not after it
    await resumed.start(position, state, until_caught_up=True)
    with pytest.raises(SourceDataError, match=r"app.jsonl:3: not valid JSON"):
        await resumed.take(1000, 0.0)
    await resumed.close()


async def test_an_idle_pass_waits_on_the_runs_clock(tmp_path: Path) -> None:
    await assert_an_idle_take_waits_on_the_clock(followed(tmp_path))


async def test_a_file_created_and_rotated_away_while_down_is_found_by_a_single_path_and_old_ones_are_not(
        tmp_path: Path) -> None:
    path, history = tmp_path / "app.jsonl", tmp_path / "app.jsonl.3"
    history.write_bytes(jsonl(100, 1))  # rotated before egress first ran: not followed, never read
    os.utime(history, ns=(1_000_000_000, 1_000_000_000))
    path.write_bytes(jsonl(0, 2))
    first = followed(tmp_path)
    await first.start(0, b"", until_caught_up=True)
    assert ids(await take_all(first)) == [0, 1]
    rotate_while_writing(path, tmp_path / "app.jsonl.1", old_tail=b"", new=jsonl(10, 1))  # read, rotated, dropped
    assert ids(await take_all(first)) == [10]
    state, position = first.source_state, first.position
    await first.close()
    # While egress is down: the file it followed is appended to and rotated, a new one is begun,
    # written and rotated in turn, and a third begun; the file read and dropped before is touched.
    append(path, jsonl(11, 1))
    os.rename(tmp_path / "app.jsonl.1", tmp_path / "app.jsonl.2")
    os.utime(tmp_path / "app.jsonl.2")  # modified later, but known: not read again
    os.rename(path, tmp_path / "app.jsonl.1")
    path.write_bytes(jsonl(20, 2))
    os.rename(path, tmp_path / "app.jsonl.0")
    path.write_bytes(jsonl(30, 1))
    second = followed(tmp_path)
    await second.start(position, state, until_caught_up=True)
    records = await take_all(second)
    assert ids(records) == [11, 20, 21, 30]
    assert len({r.source_partition for r in records}) == 3
    await second.close()


async def test_the_unread_records_of_followed_files_are_estimated_from_the_bytes_after_their_offsets(
        tmp_path: Path) -> None:
    path = tmp_path / "app.jsonl"
    path.write_bytes(jsonl(0, 10))
    source = followed(tmp_path)
    await source.start(0, b"", until_caught_up=True)
    assert source.unread_records() == 0  # no file seen yet: nothing known to be left
    assert len(await source.take(4, 0.0) or []) == 4
    assert source.unread_records() == 6  # 6 lines of the same length after the offset
    assert len(await take_all(source)) == 6
    assert source.unread_records() == 0
    append(path, jsonl(10, 5))
    assert source.unread_records() == 5  # grown: 5 more lines of the average length
    await source.close()


async def test_a_file_rotated_between_a_passs_glob_and_its_open_is_not_read_again_under_a_new_number(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The glob lists ``app.jsonl`` only; then the file is renamed into the glob (``app.jsonl.1``)
    and a new ``app.jsonl`` begins, before the pass opens the path: the pass takes the old file for
    rotated away, reads it to its end and drops it. The next pass's glob finds it at its new name:
    the same file (inode and first bytes), read already, so not a new file read from its start."""
    import egress.connectors.sources.follow as follow

    (tmp_path / "app.jsonl").write_bytes(jsonl(0, 3))
    source = followed(tmp_path, "app.jsonl*")
    await source.start(0, b"", until_caught_up=True)
    assert ids(await take_all(source)) == [0, 1, 2]
    real_glob = follow.glob.glob

    def stale_glob(pattern: str) -> list[str]:
        found = real_glob(pattern)
        os.rename(tmp_path / "app.jsonl", tmp_path / "app.jsonl.1")  # after the listing, before the open
        (tmp_path / "app.jsonl").write_bytes(jsonl(3, 2))
        monkeypatch.setattr(follow.glob, "glob", real_glob)
        return found

    monkeypatch.setattr(follow.glob, "glob", stale_glob)
    records = await take_all(source)
    assert ids(records) == [3, 4]
    await source.close()


async def test_idle_passes_wait_longer_up_to_a_bound_and_a_pass_that_reads_waits_as_asked_again(
        tmp_path: Path) -> None:
    path = tmp_path / "app.jsonl"
    path.write_bytes(b"")
    source = followed(tmp_path)
    clock = VirtualClock(1_000.0)
    source.use_clock(clock)
    await source.start(0, b"", until_caught_up=False)

    async def idle_wait() -> float:
        """How long one take with nothing to read waits (on the virtual clock)."""
        taking = asyncio.create_task(source.take(10, 0.05))
        deadline = await eventually(clock.next_deadline, what="the take waiting on the clock")
        waited = deadline - clock.now()
        await clock.advance(waited + 1e-6)  # (the deadline less now, in floats, may fall short of it)
        assert await taking == []
        return round(waited, 6)

    try:
        async with asyncio.timeout(5):
            assert await source.take(10, 0.05) == []  # the pass that finds the file: its state changed, no wait
            assert [await idle_wait() for _ in range(6)] == [0.05, 0.1, 0.2, IDLE_WAIT_MAX, IDLE_WAIT_MAX,
                                                             IDLE_WAIT_MAX]
            append(path, jsonl(0, 2))
            assert ids(await source.take(10, 0.05) or []) == [0, 1]
            assert await idle_wait() == 0.05
    finally:
        await source.close()
