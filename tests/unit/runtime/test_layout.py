"""The Spec layout a state directory records, how a changed one is described, and which committed
work a Spec cannot reach (the drained check's second half)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from egress.engines import CommittedInventory
from egress.engines.sqlite import state_directory
from egress.runtime import Plan, load_plan
from egress.runtime.layout import holds_no_work, layout_changes, layout_mismatch, spec_layout, unreachable_work
from tests.conftest import payload_spec

Edit = Callable[[dict[str, Any]], None]


def plan_of(tmp_path: Path, edit: Edit | None = None, *, partition_count: int = 4) -> Plan:
    """tests/conftest.py's payload pipeline (events → deliver → http), changed by ``edit``."""
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a", "b"], partition_count=partition_count)
    document = yaml.safe_load(spec.read_text())
    if edit is not None:
        edit(document)
    spec.write_text(yaml.safe_dump(document))
    return load_plan(spec)


def deliver(document: dict[str, Any]) -> dict[str, Any]:
    computation: dict[str, Any] = document["computations"]["deliver"]
    return computation


def set_partition_count(count: int) -> Edit:
    return lambda document: document.update(partition_count=count)


def add_column(document: dict[str, Any]) -> None:
    document["streams"]["events"]["schema"].append({"name": "extra", "type": "string"})


def change_column_type(document: dict[str, Any]) -> None:
    document["streams"]["events"]["schema"][1]["type"] = "int64"


def require_column(document: dict[str, Any]) -> None:
    document["streams"]["events"]["schema"][1]["required"] = True


def group_by_payload(document: dict[str, Any]) -> None:
    document["streams"]["events"]["group_by"] = ["payload"]


def read_another_file(document: dict[str, Any]) -> None:
    other = Path(document["sources"]["events_jsonl"]["parameters"]["path"]).with_name("other.jsonl")
    other.write_text('{"id": 1, "payload": "x"}\n')
    document["sources"]["events_jsonl"]["parameters"]["path"] = str(other)


def use_csv_source(document: dict[str, Any]) -> None:
    data = Path(document["sources"]["events_jsonl"]["parameters"]["path"]).with_name("events.csv")
    data.write_text("id,payload\n1,x\n")
    document["sources"]["events_jsonl"].update(source_class_name="csv", parameters={"path": str(data)})


def rename_source(document: dict[str, Any]) -> None:
    document["sources"]["events_file"] = document["sources"].pop("events_jsonl")


def rename_computation(document: dict[str, Any]) -> None:
    document["computations"]["send"] = document["computations"].pop("deliver")


def rename_sink(document: dict[str, Any]) -> None:
    sinks = deliver(document)["sinks"]
    sinks["webhook"] = sinks.pop("http")


def add_sink(document: dict[str, Any]) -> None:
    sinks = deliver(document)["sinks"]
    sinks["copy"] = dict(sinks["http"])


def use_firehose_sink(document: dict[str, Any]) -> None:
    deliver(document)["sinks"]["http"].update(sink_class_name="firehose_http", parameters={
        "url": "http://127.0.0.1:9/", "payload_column": "payload", "stream_name": "events"})


def drop_output(document: dict[str, Any]) -> None:
    document["streams"]["unused"] = {"schema": [{"name": "payload", "type": "string"}]}
    deliver(document)["output_stream_ids"] = ["requests", "unused"]


@pytest.mark.parametrize(("edit", "recorded_with", "now"), [
    (set_partition_count(2), "partition_count 4", "the Spec now says 2"),
    (set_partition_count(8), "partition_count 4", "the Spec now says 8"),
    (group_by_payload, "streams/events/group_by [id]", "the Spec now says [payload]"),
    (change_column_type, "streams/events/schema/payload string", "the Spec now says int64"),
    (require_column, "streams/events/schema/payload string", "the Spec now says string required"),
    (read_another_file, "sources/events_jsonl/parameters/path ", "other.jsonl"),
    (use_csv_source, "sources/events_jsonl/source_class_name jsonl", "the Spec now says csv"),
    (rename_source, "sources/events_jsonl", "the Spec now has none"),
    (rename_computation, "computations/deliver", "the Spec now has none"),
    (rename_sink, "computations/deliver/sinks/http", "the Spec now has none"),
    (use_firehose_sink, "computations/deliver/sinks/http/sink_class_name NYT::NFlow::TAsyncHttpSink",
     "the Spec now says firehose_http"),
    (drop_output, "computations/deliver/output_stream_ids [requests]", "the Spec now says [requests, unused]"),
])
def test_a_changed_layout_is_refused_naming_what_changed(
        tmp_path: Path, edit: Edit, recorded_with: str, now: str) -> None:
    recorded = spec_layout(plan_of(tmp_path))
    changed = plan_of(tmp_path, edit)
    error = layout_mismatch(recorded, changed, state_directory(tmp_path / "state"))
    assert error is not None
    text = str(error)
    assert "\n" not in text
    state = tmp_path / "state"
    assert text.startswith(f"{changed.spec_file}: state directory {state} was written with {recorded_with}")
    assert now in text
    assert text.endswith("run it with the Spec it was written with until drained, or give this Spec another "
                         "--state-dir (egress does not move committed messages, state and timers to another layout)")


def test_a_new_column_and_a_new_sink_are_changes_too(tmp_path: Path) -> None:
    recorded = spec_layout(plan_of(tmp_path))
    assert layout_changes(recorded, spec_layout(plan_of(tmp_path, add_column))) == [
        ("streams/events/schema/extra", None, "string")]
    error = layout_mismatch(recorded, plan_of(tmp_path, add_sink), state_directory("state"))
    assert error is not None
    assert "state directory state was written without computations/deliver/sinks/copy; the Spec now has it" \
        in str(error)


def test_the_message_counts_the_other_changes(tmp_path: Path) -> None:
    recorded = spec_layout(plan_of(tmp_path))

    def many(document: dict[str, Any]) -> None:
        document["partition_count"] = 2
        group_by_payload(document)
        rename_sink(document)

    error = layout_mismatch(recorded, plan_of(tmp_path, many), state_directory("state"))
    assert error is not None
    assert error.path == "partition_count"
    assert ("was written with partition_count 4; the Spec now says 2 (and 3 more changes: streams/events/group_by, "
            "computations/deliver/sinks/http, computations/deliver/sinks/webhook):") in str(error)


def parameters_and_code(document: dict[str, Any]) -> None:
    http = deliver(document)["sinks"]["http"]
    http["sink_class_name"] = "NYT::NFlow::TAsyncHttpSink"  # the same class as async_http
    http["parameters"].update(url="https://example.com/elsewhere", headers={"X-Run": "2"})
    deliver(document)["processing_function"] = "tests.pipelines:FailsOnSeven"
    deliver(document)["processing_function_parameters"] = {"anything": 1}
    document["streams"]["events"]["schema"].reverse()  # rows are stored by column name


def add_a_computation_source_and_stream(document: dict[str, Any]) -> None:
    document["streams"]["copies"] = {"schema": [{"name": "payload", "type": "string"}]}
    document["sources"]["more_events"] = dict(document["sources"]["events_jsonl"])
    document["computations"]["audit"] = dict(deliver(document), output_stream_ids=["copies"], sinks={})


@pytest.mark.parametrize("edit", [parameters_and_code, add_a_computation_source_and_stream])
def test_parameters_code_and_additions_do_not_change_the_layout(tmp_path: Path, edit: Edit) -> None:
    recorded = spec_layout(plan_of(tmp_path))
    assert layout_mismatch(recorded, plan_of(tmp_path, edit), state_directory("state")) is None


def test_a_changed_layout_in_a_nats_bucket_names_the_bucket_and_its_ways_out(tmp_path: Path) -> None:
    """A cluster's committed data is in its bucket: no --state-dir (it means nothing there), and a
    command that deletes the bucket with what egress installs."""
    from egress.engines.nats import NatsEngine

    location = NatsEngine(["nats://127.0.0.1:4222", "nats://127.0.0.1:4223"], "flights").location
    error = layout_mismatch(spec_layout(plan_of(tmp_path)), plan_of(tmp_path, group_by_payload), location)
    assert error is not None
    assert str(error) == (
        f"{tmp_path / 'spec.yaml'}: NATS bucket egress_flights at nats://127.0.0.1:4222, nats://127.0.0.1:4223 was "
        "written with streams/events/group_by [id]; the Spec now says [payload]: run it with the Spec it was written "
        "with until drained, or give this Spec another pipeline name (a bucket of its own), or, once every worker "
        "stopped, delete bucket egress_flights and everything committed in it: `egress state delete flights --engine "
        "nats://127.0.0.1:4222,nats://127.0.0.1:4223` (egress does not move committed messages, state and timers to "
        "another layout)")
    assert "--state-dir" not in str(error)


def test_the_layout_names_what_committed_data_depends_on(tmp_path: Path) -> None:
    layout = spec_layout(plan_of(tmp_path))
    assert layout == {
        "partition_count": 4,
        "streams": {
            "events": {"schema": {"id": "int64 required", "payload": "string"}, "group_by": ["id"]},
            "requests": {"schema": {"payload": "string"}, "group_by": []},
        },
        "sources": {"events_jsonl": {"source_class_name": "jsonl", "output_stream_id": "events",
                                     "parameters": {"path": str(tmp_path / "payloads.jsonl")}}},
        "computations": {"deliver": {
            "computation_class_name": "NYT::NFlow::TProcessFunctionComputation",
            "input_stream_ids": ["events"], "output_stream_ids": ["requests"],
            "sinks": {"http": {"sink_class_name": "NYT::NFlow::TAsyncHttpSink", "input_stream_ids": ["requests"]}},
        }},
    }


# -- unreachable committed work ------------------------------------------------------------------


def inventory(*, log: dict[tuple[str, int], int] | None = None,
              positions: dict[tuple[str, int], list[int]] | None = None,
              outbox: dict[tuple[str, int, str], int] | None = None,
              timers: dict[tuple[str, int], int] | None = None) -> CommittedInventory:
    return CommittedInventory(log or {}, positions or {}, outbox or {}, timers or {})


def test_log_partitions_beyond_partition_count_are_unreachable_from_their_last_committed_position(
        tmp_path: Path) -> None:
    plan = plan_of(tmp_path, partition_count=2)
    found = inventory(log={("events", p): 100 for p in range(4)},
                      positions={("events", 0): [100], ("events", 2): [40]})
    assert unreachable_work(found, plan) == [
        "stream events partition 2: 60 committed messages no job of this Spec reads (partition_count is 2)",
        "stream events partition 3: 100 committed messages no job of this Spec reads (partition_count is 2)",
    ]


def test_a_stream_no_computation_reads_any_more_is_unreachable_but_one_never_read_is_not(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, partition_count=1)
    found = inventory(log={("old_input", 0): 10, ("requests", 0): 5}, positions={("old_input", 0): [4]})
    assert unreachable_work(found, plan) == [
        "stream old_input partition 0: 6 committed messages no job of this Spec reads (no computation reads "
        "old_input now)"]


def test_outbox_and_timers_without_a_job_are_unreachable(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, partition_count=2)
    found = inventory(
        outbox={("deliver", 0, "requests"): 7, ("deliver", 3, "requests"): 2, ("gone", 0, "requests"): 1,
                ("deliver", 1, "unsunk"): 4},
        timers={("deliver", 1): 3, ("deliver", 2): 5, ("gone", 0): 1})
    assert unreachable_work(found, plan) == [
        "computation deliver partition 1: 4 committed messages of stream unsunk no sink of this Spec delivers "
        "(no sink of deliver reads unsunk)",
        "computation deliver partition 3: 2 committed messages of stream requests no sink of this Spec delivers "
        "(partition_count is 2)",
        "computation gone partition 0: 1 committed messages of stream requests no sink of this Spec delivers "
        "(the Spec has no computation gone)",
        "computation deliver partition 2: 5 timers that will never fire (partition_count is 2)",
        "computation gone partition 0: 1 timers that will never fire (the Spec has no computation gone)",
    ]


def test_work_every_job_of_the_spec_owns_is_reachable(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, partition_count=2)
    found = inventory(log={("events", 0): 9, ("events", 1): 3}, positions={("events", 0): [2]},
                      outbox={("deliver", 1, "requests"): 3}, timers={("deliver", 0): 1})
    assert unreachable_work(found, plan) == []


@pytest.mark.parametrize(("inventory", "empty"), [
    (CommittedInventory({("events", 0): 5}, {("events", 0): [5, 5]}, {("deliver", 0, "requests"): 0}, {}), True),
    (CommittedInventory({("events", 0): 5}, {}, {}, {}), True),  # read by no computation: never on its way
    (CommittedInventory({("events", 0): 5}, {("events", 0): [5, 3]}, {}, {}), False),  # one reader behind
    (CommittedInventory({}, {}, {("deliver", 1, "requests"): 2}, {}), False),  # output not yet delivered
    (CommittedInventory({}, {}, {}, {("deliver", 0): 1}), False),  # a timer pending
])
def test_a_state_directory_holds_no_work_once_every_read_log_outbox_and_timer_is_done(
        inventory: CommittedInventory, empty: bool) -> None:
    assert holds_no_work(inventory) is empty
