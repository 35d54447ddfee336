"""A Spec changed between runs on one state directory: refused before anything changes when the
layout differs, resumed by the original Spec, and never reported drained while committed work is
out of reach."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from egress.engines.sqlite import DATABASE_NAME, read_metadata
from egress.errors import SpecMismatchError
from egress.receiver import Receiver, ReceiverConfig
from egress.runtime import Pipeline, RunOptions, RunResult, load_plan
from egress.runtime.layout import LAYOUT_KEY
from tests.conftest import ServerFactory, payload_spec, state_contents

pytestmark = pytest.mark.integration

PAYLOADS = [f"p{i}" for i in range(200)]
Edit = Callable[[dict[str, Any]], None]


def spec_files(tmp_path: Path, url: str, partition_count: int, edit: Edit | None = None,
               **dynamic: Any) -> tuple[Path, Path]:
    spec, dynamic_spec = payload_spec(tmp_path, url, PAYLOADS, partition_count=partition_count,
                                      dynamic_parameters=dynamic)
    if edit is not None:
        document = yaml.safe_load(spec.read_text())
        edit(document)
        spec.write_text(yaml.safe_dump(document))
    return spec, dynamic_spec


async def run(spec: Path, dynamic: Path | None, state: Path) -> RunResult:
    return await Pipeline(load_plan(spec, dynamic), state, options=RunOptions(until_drained=True)).run()


async def strand_everything(tmp_path: Path, serve_app: ServerFactory, partition_count: int) -> Path:
    """A first run whose every delivery fails terminally: all 200 messages stay committed in the
    outbox of their partitions. Returns the state directory."""
    failing = await serve_app(Receiver(ReceiverConfig(fail_rate=1.0, fail_status=500)).app)
    state = tmp_path / "state"
    first = await run(*spec_files(tmp_path, f"{failing}/events", partition_count, max_attempt_count=1), state)
    assert first.blocked
    return state



def group_by_payload(document: dict[str, Any]) -> None:
    document["streams"]["events"]["group_by"] = ["payload"]


def add_column(document: dict[str, Any]) -> None:
    document["streams"]["events"]["schema"].append({"name": "extra", "type": "string"})


def read_another_file(document: dict[str, Any]) -> None:
    other = Path(document["sources"]["events_jsonl"]["parameters"]["path"]).with_name("more.jsonl")
    other.write_text('{"id": 1, "payload": "x"}\n')
    document["sources"]["events_jsonl"]["parameters"]["path"] = str(other)


def rename_computation(document: dict[str, Any]) -> None:
    document["computations"]["send"] = document["computations"].pop("deliver")


@pytest.mark.parametrize(("written_with", "now", "edit", "named"), [
    (4, 2, None, "was written with partition_count 4; the Spec now says 2"),
    (2, 4, None, "was written with partition_count 2; the Spec now says 4"),
    (4, 4, group_by_payload, "was written with streams/events/group_by [id]; the Spec now says [payload]"),
    (4, 4, add_column, "was written without streams/events/schema/extra; the Spec now has string"),
    (4, 4, read_another_file, "was written with sources/events_jsonl/parameters/path "),
    (4, 4, rename_computation, "was written with computations/deliver; the Spec now has none"),
], ids=["partition_count 4 to 2", "partition_count 2 to 4", "group_by", "schema", "source", "computation"])
async def test_a_changed_layout_is_refused_with_nothing_changed_and_the_original_spec_resumes(
        tmp_path: Path, serve_app: ServerFactory, written_with: int, now: int, edit: Edit | None, named: str) -> None:
    state = await strand_everything(tmp_path, serve_app, written_with)
    before = state_contents(state)
    receiver = Receiver()
    url = f"{await serve_app(receiver.app)}/events"
    changed, _ = spec_files(tmp_path, url, now, edit)
    with pytest.raises(SpecMismatchError) as refused:
        await run(changed, None, state)  # (the DynamicSpec names computation deliver)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{changed}: state directory {state} {named}")
    assert message.endswith("run it with the Spec it was written with until drained, or give this Spec another "
                            "--state-dir (egress does not move committed messages, state and timers to another layout)")
    assert state_contents(state) == before
    assert receiver.stats.requests == 0

    resumed = await run(*spec_files(tmp_path, url, written_with), state)  # a new URL is no layout change
    assert resumed.drained
    assert resumed.ok
    assert len(receiver.stats.delivered_keys) == len(PAYLOADS)


async def test_a_changed_layout_on_a_drained_state_directory_is_refused_without_advising_to_drain_it(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    url = f"{await serve_app(receiver.app)}/events"
    state = tmp_path / "state"
    first = await run(*spec_files(tmp_path, url, 4), state)
    assert first.drained
    changed, _ = spec_files(tmp_path, url, 2)
    with pytest.raises(SpecMismatchError) as refused:
        await run(changed, None, state)
    assert str(refused.value) == (
        f"{changed}: state directory {state} was written with partition_count 4; the Spec now says 2: everything "
        "committed there is already delivered, but this Spec cannot take over its state and source positions: give "
        "this Spec another --state-dir (its sources are then read from the start), or keep running the Spec it was "
        "written with")


async def test_the_drained_check_counts_committed_work_out_of_reach_even_with_the_layout_check_bypassed(
        tmp_path: Path, serve_app: ServerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    state = await strand_everything(tmp_path, serve_app, 4)

    async def bypassed(self: Pipeline, engine: object) -> None:
        return None

    monkeypatch.setattr(Pipeline, "_check_state_directory", bypassed)
    receiver = Receiver()
    result = await run(*spec_files(tmp_path, f"{await serve_app(receiver.app)}/events", 2), state)
    assert not result.drained
    assert not result.ok
    assert [line.split(":")[0] for line in result.unreachable] == [
        "computation deliver partition 2", "computation deliver partition 3"]
    assert all(line.endswith("committed messages of stream requests no sink of this Spec delivers "
                             "(partition_count is 2)") for line in result.unreachable)
    stranded = sum(int(line.split(": ")[1].split(" ")[0]) for line in result.unreachable)
    assert len(receiver.stats.delivered_keys) + stranded == len(PAYLOADS)


def forget_layout(state: Path) -> None:
    """Make ``state`` look written by an egress from before the layout record."""
    db = sqlite3.connect(state / DATABASE_NAME)
    with db:
        db.execute("DELETE FROM meta WHERE key = ?", (LAYOUT_KEY,))
    db.close()


async def test_a_directory_without_a_recorded_layout_gets_the_layout_of_the_spec_that_opens_it(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    url = f"{await serve_app(receiver.app)}/events"
    state = tmp_path / "state"
    assert (await run(*spec_files(tmp_path, url, 4), state)).drained
    recorded = (read_metadata(state) or {})[LAYOUT_KEY]
    forget_layout(state)
    assert (await run(*spec_files(tmp_path, url, 4), state)).drained
    assert (read_metadata(state) or {})[LAYOUT_KEY] == recorded


async def test_a_directory_without_a_recorded_layout_is_refused_when_the_spec_cannot_reach_its_work(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    state = await strand_everything(tmp_path, serve_app, 4)
    forget_layout(state)
    before = state_contents(state)
    spec, dynamic = spec_files(tmp_path, "http://127.0.0.1:9/events", 2)
    with pytest.raises(SpecMismatchError) as refused:
        await run(spec, dynamic, state)
    assert str(refused.value).startswith(
        f"{spec}: state directory {state} records no Spec layout (an earlier egress wrote it) and holds committed "
        "work this Spec cannot reach: computation deliver partition 2: ")
    assert "(and 1 more): run it with the Spec it was written with until drained" in str(refused.value)
    assert state_contents(state) == before


async def test_a_new_computation_is_accepted_and_added_to_the_record(tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    url = f"{await serve_app(receiver.app)}/events"
    state = tmp_path / "state"
    assert (await run(*spec_files(tmp_path, url, 2), state)).drained

    def add_audit(document: dict[str, Any]) -> None:
        audit = dict(document["computations"]["deliver"])
        audit["sinks"] = {"copy": dict(audit["sinks"]["http"], parameters={"url": f"{url}/audit",
                                                                           "payload_column": "payload"})}
        document["computations"]["audit"] = audit

    result = await run(*spec_files(tmp_path, url, 2, add_audit), state)
    assert result.drained
    assert receiver.stats.requests == 2 * len(PAYLOADS)  # the new computation reads the log from its start
    assert '"audit"' in (read_metadata(state) or {})[LAYOUT_KEY]
