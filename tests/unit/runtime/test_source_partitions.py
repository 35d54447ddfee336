"""Sources read by several readers (issue 24): the reader units and their engine keys, the plan's
reader count and its errors, the layout record, the assignment of each computation's and source's
units, and the followed files dealt by reader 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from egress.connectors.sources import JsonlSource
from egress.connectors.sources.files import FileSourceParameters
from egress.connectors.sources.follow import FollowedFiles
from egress.errors import SpecErrors
from egress.keys import EMPTY_KEY, partition_of
from egress.runtime import load_plan
from egress.runtime.cluster.assignment import assign, groups, units_of
from egress.runtime.hosts import plan_units
from egress.runtime.lanes import lane, lanes
from egress.runtime.layout import spec_layout
from egress.runtime.source_reader import SOURCE_STATE, finished_key, source_state_key
from egress.runtime.unit import Unit
from egress.spec import StreamSpec

STREAM = StreamSpec.model_validate({"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                                    "group_by": ["id"]})


def spec_document(tmp_path: Path) -> dict[str, Any]:
    """A followed glob of JSONL files → deliver (4 partitions) → http."""
    (tmp_path / "logs").mkdir(exist_ok=True)
    return {
        "pipeline": "partitioned",
        "partition_count": 4,
        "streams": {"events": {"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                               "group_by": ["id"]},
                    "requests": {"schema": [{"name": "payload", "type": "string"}]}},
        "sources": {"logs": {"source_class_name": "jsonl", "output_stream_id": "events",
                             "parameters": {"path": "logs/*.jsonl", "follow": True, "readers": 3}}},
        "computations": {"deliver": {
            "processing_function": "tests.pipelines:Passthrough", "input_stream_ids": ["events"],
            "output_stream_ids": ["requests"],
            "sinks": {"http": {"sink_class_name": "async_http", "input_stream_ids": ["requests"],
                               "parameters": {"url": "http://127.0.0.1:9/", "payload_column": "payload"}}}}},
    }


def plan_problems(tmp_path: Path, document: dict[str, Any]) -> list[str]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(document))
    with pytest.raises(SpecErrors) as refused:
        load_plan(spec)
    return [str(error) for error in refused.value.errors]


def nats_source(**parameters: Any) -> dict[str, Any]:
    return {"source_class_name": "nats", "output_stream_id": "events",
            "parameters": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", **parameters}}


def test_a_source_with_one_reader_keeps_the_keys_of_earlier_runs() -> None:
    assert Unit.source("events").key == ("source:events", 0) == Unit.source("events", 0).key
    assert source_state_key(0, 1) == SOURCE_STATE == ("source", EMPTY_KEY)
    assert finished_key("events") == finished_key("events", 0) == "source_finished.events"


@pytest.mark.parametrize("readers", [2, 3, 4, 7, 16])
def test_each_reader_commits_its_state_under_a_key_of_its_own_partition(readers: int) -> None:
    keys = [source_state_key(k, readers) for k in range(readers)]
    assert len(set(keys)) == readers
    assert [partition_of(key, readers) for _, key in keys] == list(range(readers))
    assert len({finished_key("events", k) for k in range(readers)}) == readers


def test_a_readers_finished_flag_never_is_another_sources() -> None:
    """Source ids may hold dots: ``a`` partition 1 and ``a.1`` partition 0 have flags of their own."""
    flags = [finished_key("a", 1), finished_key("a.1"), finished_key("a", 11), finished_key("a.1", 1)]
    assert len(set(flags)) == len(flags)


def test_the_plan_has_one_unit_per_reader_partition(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_document(tmp_path)))
    plan = load_plan(spec)
    assert plan.sources["logs"].readers == 3
    assert plan_units(plan)[:3] == [Unit.source("logs", k) for k in range(3)]
    assert len(plan_units(plan)) == 3 + 4


def test_the_layout_records_the_readers_only_when_there_are_several(tmp_path: Path) -> None:
    document = spec_document(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(document))
    assert spec_layout(load_plan(spec))["sources"]["logs"]["parameters"] == {"path": "logs/*.jsonl", "readers": 3}
    document["sources"]["logs"]["parameters"]["readers"] = 1
    spec.write_text(yaml.safe_dump(document))
    assert spec_layout(load_plan(spec))["sources"]["logs"]["parameters"] == {"path": "logs/*.jsonl"}


@pytest.mark.parametrize(("parameters", "expected"), [
    ({"readers": 0}, "sources/logs/parameters/readers: "),
    ({"readers": 2000}, "sources/logs/parameters/readers: "),
    ({"readers": "2"}, "sources/logs/parameters/readers: "),
    ({"follow": False, "path": "logs/a.jsonl"}, "sources/logs/parameters/readers: readers: 3 shares the files of a "
                                                "glob among readers: it needs follow: true and a glob path"),
    ({"path": "logs/app.jsonl"}, "sources/logs/parameters/readers: readers: 3 shares the files"),
], ids=["zero", "too-many", "quoted", "not-followed", "no-glob"])
def test_bad_file_source_readers_are_refused_naming_the_parameter(
        tmp_path: Path, parameters: dict[str, Any], expected: str) -> None:
    document = spec_document(tmp_path)
    (tmp_path / "logs" / "a.jsonl").write_text("")
    document["sources"]["logs"]["parameters"].update(parameters)
    problems = plan_problems(tmp_path, document)
    assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize(("parameters", "expected"), [
    ({"readers": 2}, "sources/logs/parameters/subject: readers: 2 needs a subject holding the token {partition}"),
    ({"readers": 2, "subject": "orders.>"}, "sources/logs/parameters/subject: readers: 2 needs the token "
                                            "{partition} in the subject"),
    ({"readers": 2, "subject": "orders.p{partition}.*"}, "sources/logs/parameters/subject: {partition} must be "
                                                         "one whole token of the subject"),
    ({"readers": 0, "subject": "orders.{partition}.*"}, "sources/logs/parameters/readers: "),
], ids=["no-subject", "no-token", "part-of-a-token", "zero"])
def test_bad_nats_source_readers_are_refused_naming_the_parameter(
        tmp_path: Path, parameters: dict[str, Any], expected: str) -> None:
    document = spec_document(tmp_path)
    document["sources"]["logs"] = nats_source(**parameters)
    problems = plan_problems(tmp_path, document)
    assert any(expected in problem for problem in problems), problems


def test_nats_reader_k_filters_the_subjects_of_partition_k(tmp_path: Path) -> None:
    document = spec_document(tmp_path)
    document["sources"]["logs"] = nats_source(readers=3, subject="orders.{partition}.*")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(document))
    parameters = load_plan(spec).sources["logs"].parameters
    assert [parameters.partition_subject(k) for k in range(3)] == ["orders.0.*", "orders.1.*", "orders.2.*"]


def pipeline(readers: int, partitions: int, computations: int = 1) -> list[Unit]:
    units = [Unit.source("events", k) for k in range(readers)]
    return units + [Unit.computation(f"c{c}", p) for c in range(computations) for p in range(partitions)]


@pytest.mark.parametrize(("readers", "partitions", "members"),
                         [(1, 4, 2), (2, 4, 2), (1, 8, 3), (3, 5, 2), (4, 16, 4), (1, 4, 3)])
def test_every_member_gets_its_share_of_each_computation_and_each_source(
        readers: int, partitions: int, members: int) -> None:
    """The benchmark's shape (one reader, 4 partitions, 2 workers) once gave 3 delivering partitions
    to one worker and the reader and 1 partition to the other: 75 % / 25 % of the POSTs."""
    for seed in range(50):
        names = [f"w{seed}-{m}" for m in range(members)]
        owners = assign(pipeline(readers, partitions, 2), names)
        for group in groups(owners):
            loads = [sum(1 for unit in group if owners[unit] == name) for name in names]
            assert max(loads) - min(loads) <= 1, (group[0], loads)
        totals = [len(units_of(owners, name)) for name in names]
        assert max(totals) - min(totals) <= 1


def jsonl(start: int, count: int) -> bytes:
    return b"".join(orjson.dumps({"id": i, "payload": f"p{i}"}) + b"\n" for i in range(start, start + count))


async def test_the_readers_of_a_followed_glob_get_equal_counts_of_its_files_dealt_by_reader_0_numbered_apart(
        tmp_path: Path) -> None:
    for index in range(12):
        (tmp_path / f"f{index:02}.jsonl").write_bytes(jsonl(100 * index, 3))
    readers = []
    for k in range(3):
        source = JsonlSource.create("logs", FileSourceParameters(path="*.jsonl", follow=True, readers=3), STREAM,
                                    tmp_path)
        assert isinstance(source, FollowedFiles)
        source.read_partition(k, 3)
        readers.append(source)

    async def reader_state(k: int) -> bytes:  # reader k's state once its batch is committed
        return readers[k].source_state

    for source in readers:
        source.deal_from(reader_state)
    taken: dict[int, list[tuple[int, int, int]]] = {}
    for k, source in enumerate(readers):
        await source.start(0, b"", until_caught_up=True)
        while (records := await source.take(1000, 0.0)) is not None:
            taken.setdefault(k, []).extend((r.source_partition, r.position, r.row["id"]) for r in records)
        await source.close()
    every = sorted(row for rows in taken.values() for row in rows)
    assert sorted(row_id for _, _, row_id in every) == sorted(100 * i + j for i in range(12) for j in range(3))
    assert len({(number, position) for number, position, _ in every}) == 36  # no two share a message id
    for k, rows in taken.items():
        assert {number % 3 for number, _, _ in rows} == {k}
    files = {k: sorted({row_id // 100 for _, _, row_id in rows}) for k, rows in taken.items()}
    assert files == {0: [0, 3, 6, 9], 1: [1, 4, 7, 10], 2: [2, 5, 8, 11]}  # 4 each, in the glob's order


async def test_a_single_reader_numbers_its_files_as_before(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(jsonl(0, 1))
    (tmp_path / "b.jsonl").write_bytes(jsonl(1, 1))
    source = JsonlSource.create("logs", FileSourceParameters(path="*.jsonl", follow=True), STREAM, tmp_path)
    assert isinstance(source, FollowedFiles)
    source.read_partition(0, 1)
    await source.start(0, b"", until_caught_up=True)
    records = await source.take(1000, 0.0)
    assert records is not None
    assert [(r.source_partition, r.row["id"]) for r in records] == [(0, 0), (1, 1)]
    assert orjson.loads(source.source_state)["next_number"] == 2
    await source.close()


def test_reader_0_writes_the_stream_itself_and_each_other_reader_a_lane_of_its_own() -> None:
    assert lanes("events", 1) == ["events"]
    assert lanes("events", 3) == ["events", "events#1", "events#2"]
    assert [lane("events", k) for k in range(3)] == lanes("events", 3)
    # Lanes after reader 0 never meet another stream's: only a stream's own id can (the plan refuses it).
    assert len({lane(stream, k) for stream in ("a", "a#1", "a#2") for k in range(1, 12)}) == 33


def test_a_computation_reads_every_lane_of_a_stream_and_sees_the_stream(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_document(tmp_path)))
    plan = load_plan(spec)
    assert plan.computations["deliver"].input_stream_ids == ["events"]
    assert plan.computations["deliver"].input_lanes == {"events": "events", "events#1": "events", "events#2": "events"}
    assert [plan.sources["logs"].lane(k) for k in range(3)] == ["events", "events#1", "events#2"]
    assert [plan.stream_of(name) for name in ("events", "events#2", "requests", "events#3")] == [
        "events", "events", "requests", "events#3"]


def test_one_reader_reads_the_stream_alone(tmp_path: Path) -> None:
    document = spec_document(tmp_path)
    document["sources"]["logs"]["parameters"]["readers"] = 1
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(document))
    assert load_plan(spec).computations["deliver"].input_lanes == {"events": "events"}


def test_a_lane_that_is_another_streams_id_is_refused_naming_the_readers(tmp_path: Path) -> None:
    document = spec_document(tmp_path)
    document["streams"]["events#2"] = {"schema": [{"name": "payload", "type": "string"}]}
    problems = plan_problems(tmp_path, document)
    assert problems == [f'{tmp_path / "spec.yaml"}: sources/logs/parameters/readers: reader 2 of this source '
                        'writes the log stream "events#2" (its lane of stream "events"), which is the id of '
                        'another stream: rename that stream or give the source at most 2 readers'], problems
