"""The record-file reader the e2e tests poll with while a receiver writes."""

from __future__ import annotations

from pathlib import Path

from tests.receiver_record import recorded, recorded_count


def test_a_line_still_being_written_is_left_for_the_next_read(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    record.write_text('{"status": 200}\n{"time": 1.5, "method": "POST", ')
    assert recorded(record) == [{"status": 200}]
    assert recorded_count(record) == 1
    with record.open("a") as tail:
        tail.write('"status": 503}\n')
    assert recorded(record) == [{"status": 200}, {"time": 1.5, "method": "POST", "status": 503}]
    assert recorded_count(record) == 2


def test_a_record_not_written_yet_holds_nothing(tmp_path: Path) -> None:
    assert recorded(tmp_path / "absent.jsonl") == []
    assert recorded_count(tmp_path / "absent.jsonl") == 0
