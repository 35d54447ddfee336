"""``on_bad_record`` on the sources: ``fail`` stops the run (the default), ``skip`` drops a bad record
and ``dead_letter`` writes it to a file first; both keep the later records' ids and are counted in
the metrics and the run summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from rich.console import Console

from egress.cli.report import final_report, summary_table
from egress.clock import VirtualClock
from egress.connectors.sources.bad_records import BadRecordParameters, BadRecords
from egress.errors import SourceDataError, SpecErrors
from egress.receiver import Receiver
from egress.runtime import Pipeline, RunOptions, load_plan
from tests.conftest import ServerFactory, payload_key, payload_spec

pytestmark = pytest.mark.integration

LINES = [b'{"id": 0, "payload": "p0"}', b'{"id": 1, "payload": ', b'{"id": "two", "payload": "p2"}',
         b'{"id": 3, "payload": "p3"}']


def with_source_parameters(spec: Path, **parameters: Any) -> None:
    document = yaml.safe_load(spec.read_text())
    document["sources"]["events_jsonl"]["parameters"].update(parameters)
    spec.write_text(yaml.safe_dump(document))


async def run_with_bad_lines(tmp_path: Path, url: str, clock: VirtualClock | None = None,
                             **parameters: Any) -> tuple[Pipeline, Any]:
    spec, dynamic = payload_spec(tmp_path, url, [])
    (tmp_path / "payloads.jsonl").write_bytes(b"\n".join(LINES) + b"\n")
    with_source_parameters(spec, **parameters)
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state", clock=clock,
                        options=RunOptions(until_drained=True))
    if clock is None:
        return pipeline, await pipeline.run()
    async with clock.autojumping():
        return pipeline, await pipeline.run()


async def test_a_bad_record_stops_the_run_by_default_naming_file_line_and_reason(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    _, result = await run_with_bad_lines(tmp_path, f"{await serve_app(receiver.app)}/events")
    assert isinstance(result.error, SourceDataError)
    assert f"{tmp_path / 'payloads.jsonl'}:2: not valid JSON" in str(result.error)


async def test_skipped_records_keep_the_later_ids_and_are_counted_in_the_summary(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    pipeline, result = await run_with_bad_lines(tmp_path, f"{await serve_app(receiver.app)}/events",
                                                on_bad_record="skip")
    assert result.ok
    assert result.drained
    assert sorted(receiver.stats.delivered_keys) == sorted([payload_key(tmp_path, 0), payload_key(tmp_path, 3)])
    report = final_report(pipeline, result)
    assert (report["rows_read"], report["bad_records_skipped"], report["bad_records_dead_lettered"]) == (2, 2, 0)
    console = Console(record=True, width=120)
    console.print(summary_table(report))
    assert "bad records skipped" in console.export_text()


async def test_dead_lettered_records_are_written_with_their_place_and_reason(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    pipeline, result = await run_with_bad_lines(tmp_path, f"{await serve_app(receiver.app)}/events",
                                                on_bad_record="dead_letter", dead_letter_path="bad.jsonl")
    assert result.ok
    assert receiver.stats.requests == 2
    letters = [orjson.loads(line) for line in (tmp_path / "bad.jsonl").read_bytes().splitlines()]
    file = str(tmp_path / "payloads.jsonl")
    assert [(e["source"], e["input"], e["position"], e["record"], e["record_encoding"]) for e in letters] == [
        ("events_jsonl", file, 1, LINES[1].decode() + "\n", "utf-8"),
        ("events_jsonl", file, 2, LINES[2].decode() + "\n", "utf-8")]
    assert letters[1]["error"] == f"{file}:3: column id: expected int64, got str 'two'"
    assert final_report(pipeline, result)["bad_records_dead_lettered"] == 2


async def test_a_dead_letter_is_stamped_by_the_runs_clock(tmp_path: Path, serve_app: ServerFactory) -> None:
    clock = VirtualClock(1_000_000.0)
    _, result = await run_with_bad_lines(tmp_path, f"{await serve_app(Receiver().app)}/events", clock,
                                         on_bad_record="dead_letter", dead_letter_path="bad.jsonl")
    assert result.ok
    letters = [orjson.loads(line) for line in (tmp_path / "bad.jsonl").read_bytes().splitlines()]
    # The virtual time (which jumps while the run waits), not the machine's.
    assert len(letters) == 2
    assert all(1_000_000.0 <= e["dead_lettered_at"] < 1_000_000.0 + 3600 for e in letters)


def test_a_record_read_again_after_a_crash_is_not_dead_lettered_twice(tmp_path: Path) -> None:
    parameters = BadRecordParameters(on_bad_record="dead_letter", dead_letter_path="bad.jsonl")
    for _ in range(2):  # the second run reads the record again: its position was not committed
        BadRecords("s", parameters, tmp_path).handle(SourceDataError("f:1: bad"), "f", 0, b"\xff")
    lines = (tmp_path / "bad.jsonl").read_bytes().splitlines()
    assert len(lines) == 1
    assert orjson.loads(lines[0])["record_encoding"] == "base64"


def test_dead_letter_needs_a_path_and_a_path_needs_dead_letter(tmp_path: Path) -> None:
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["x"])
    with_source_parameters(spec, on_bad_record="dead_letter")
    with pytest.raises(SpecErrors, match="on_bad_record: dead_letter needs dead_letter_path"):
        load_plan(spec, dynamic)
    with_source_parameters(spec, on_bad_record="skip", dead_letter_path="bad.jsonl")
    with pytest.raises(SpecErrors, match="dead_letter_path is used only with on_bad_record: dead_letter"):
        load_plan(spec, dynamic)


def test_the_summary_of_several_processes_adds_up_their_bad_records(tmp_path: Path) -> None:
    from egress.cli.processes import merge_reports

    for index, skipped in enumerate((2, 3)):
        (tmp_path / f"worker-{index}.json").write_text(orjson.dumps(
            {"rows_read": 1, "bad_records_skipped": skipped, "bad_records_dead_lettered": 1, "drained": True,
             "elapsed_seconds": 1.0}).decode())
    merged = merge_reports([tmp_path / "worker-0.json", tmp_path / "worker-1.json"], 1.0)
    assert (merged["bad_records_skipped"], merged["bad_records_dead_lettered"]) == (5, 2)
    console = Console(record=True, width=120)
    console.print(summary_table(merged))
    assert "bad records dead-lettered" in console.export_text()
