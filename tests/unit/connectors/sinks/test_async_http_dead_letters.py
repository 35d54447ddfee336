"""Dead letters of the async HTTP sink on the virtual clock: what a line records, when it is
acknowledged, and what happens when it cannot be written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from egress.connectors.dead_letters import read_dead_letters
from egress.errors import SpecError
from egress.runtime import load_plan
from tests.conftest import payload_spec
from tests.unit.connectors.sinks.test_async_http_delivery import STATUS, Harness, Outcome, always


def failing_for(*payloads: str, status: int = 503) -> Any:
    """200 for every payload except ``payloads``, which always get ``status``."""
    return lambda request, n: Outcome(status if request.body.decode() in payloads else 200)


async def test_an_exhausted_delivery_is_dead_lettered_then_acknowledged_and_later_messages_go_on(
        tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    h = Harness(failing_for("b"), static={"dead_letter_path": str(path)}, dynamic={"max_attempt_count": 3},
                start=1000.0)  # so that attempt times are recognisable
    h.distribute(["a", "b", "c"])
    await h.clock.advance(100)
    assert h.sink.terminal_error is None
    assert h.sink.progress().max_persisted_seq_no == 3
    assert h.sink.unacknowledged == 0
    [line] = [json.loads(text) for text in path.read_text().splitlines()]
    assert line.pop("dead_lettered_at") == 1003.0  # at the instant the last permitted attempt failed
    assert line == {
        "computation": "deliver", "sink": "http", "partition": 0, "seq": 2,
        "message_id": b"m2".hex(), "idempotency_key": b"m2".hex().upper(), "payload": "b",
        "payload_encoding": "utf-8",
        "attempts": [{"time": t, "status": 503, "error": None} for t in (1000.0, 1001.0, 1003.0)],
        "error": "Async HTTP POST retry policy exhausted after 3 attempt(s); last error: HTTP status 503",
    }
    assert h.counter("dead_letters") == 1
    assert h.counter("records_delivered") == 2
    assert h.status.error(STATUS) is None  # the dead-lettered delivery no longer shows as failing


async def test_a_deadline_exhausted_delivery_records_its_transport_errors(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    h = Harness(lambda request, n: Outcome(200, latency=10.0), static={"dead_letter_path": str(path)},
                dynamic={"request_timeout": "2500ms", "attempt_timeout": "1s"})
    h.distribute(["slow"])
    await h.clock.advance(100)
    [letter], _ = read_dead_letters(path)
    assert [(a.time, a.status, a.error) for a in letter.attempts] == [
        (1.0, None, "curl error 28: Operation timed out"), (2.5, None, "curl error 28: Operation timed out")]
    assert letter.error.startswith("Async HTTP POST retry deadline exhausted after 2 attempt(s)")
    assert h.sink.progress().max_persisted_seq_no == 1


async def test_a_bytes_payload_that_is_not_utf8_is_dead_lettered_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    h = Harness(always(500), static={"dead_letter_path": str(path)}, dynamic={"max_attempt_count": 1})
    h.distribute([b"\xff\xfe raw"])
    await h.clock.advance(10)
    [letter], _ = read_dead_letters(path)
    assert letter.payload == b"\xff\xfe raw"
    assert json.loads(path.read_text())["payload_encoding"] == "base64"


async def test_a_dead_letter_that_cannot_be_written_blocks_the_partition(tmp_path: Path) -> None:
    path = tmp_path / "gone" / "dead.jsonl"
    h = Harness(failing_for("b"), static={"dead_letter_path": str(path)}, dynamic={"max_attempt_count": 1})
    h.distribute(["a", "b", "c"])
    await h.clock.advance(10)
    assert h.sink.progress().max_persisted_seq_no == 1
    error = h.sink.terminal_error or ""
    assert error.startswith("Async HTTP POST retry policy exhausted after 1 attempt(s)")
    assert f"cannot be written to the dead-letter file {path}" in error
    assert h.counter("dead_letters") == 0


async def test_without_dead_letter_path_an_exhausted_delivery_still_blocks() -> None:
    h = Harness(failing_for("b"), dynamic={"max_attempt_count": 1})
    h.distribute(["a", "b", "c"])
    await h.clock.advance(10)
    assert h.sink.progress().max_persisted_seq_no == 1
    assert h.sink.terminal_error is not None


async def test_a_message_dead_lettered_again_after_a_restart_has_one_line(tmp_path: Path) -> None:
    """The restart after a crash that came before the acknowledgement was committed: a new instance
    (and a new run's files) gets the same message, and it fails again."""
    path = tmp_path / "dead.jsonl"
    for _ in range(2):
        h = Harness(always(503), static={"dead_letter_path": str(path)}, dynamic={"max_attempt_count": 1})
        h.distribute(["a", "b"])
        await h.clock.advance(10)
        assert h.sink.progress().max_persisted_seq_no == 2
        await h.sink.close()
    assert [letter.seq for letter in read_dead_letters(path)[0]] == [1, 2]


def test_a_dead_letter_path_in_a_missing_folder_is_refused_before_anything_runs(tmp_path: Path) -> None:
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", [],
                                 sink_parameters={"dead_letter_path": str(tmp_path / "missing" / "dead.jsonl")})
    with pytest.raises(SpecError) as raised:
        load_plan(spec, dynamic)
    assert str(raised.value) == (
        f'{spec}: computations/deliver/sinks/http/parameters/dead_letter_path: folder "{tmp_path / "missing"}" of '
        "the dead-letter file does not exist: create it, or point dead_letter_path into an existing folder")


def test_a_dead_letter_path_that_is_a_directory_is_refused_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "dead").mkdir()
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", [],
                                 sink_parameters={"dead_letter_path": str(tmp_path / "dead")})
    with pytest.raises(SpecError) as raised:
        load_plan(spec, dynamic)
    assert str(raised.value) == (
        f'{spec}: computations/deliver/sinks/http/parameters/dead_letter_path: "{tmp_path / "dead"}" is a directory, '
        "not a file: point dead_letter_path at a file in it, e.g. dead_letters.jsonl")


def relative_paths_spec(tmp_path: Path, sink_parameters: dict[str, Any]) -> Path:
    """The payload pipeline in tmp_path/specs, its source dead-lettering to the relative bad.jsonl."""
    folder = tmp_path / "specs"
    folder.mkdir()
    spec, _ = payload_spec(folder, "http://127.0.0.1:9/events", [], sink_parameters=sink_parameters)
    document = yaml.safe_load(spec.read_text())
    document["sources"]["events_jsonl"]["parameters"].update(on_bad_record="dead_letter", dead_letter_path="bad.jsonl")
    spec.write_text(yaml.safe_dump(document))
    return spec


def test_a_relative_dead_letter_path_starts_at_the_specs_folder_for_a_sink_as_for_a_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule, whatever folder egress runs in: the Spec's folder, as a source's paths."""
    spec = relative_paths_spec(tmp_path, {"dead_letter_path": "dead.jsonl", "tls_ca_file": "ca.pem"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    plan = load_plan(spec)
    parameters = plan.computations["deliver"].sinks["http"].parameters
    assert parameters.dead_letter_path == str(tmp_path / "specs" / "dead.jsonl")
    assert parameters.tls_ca_file == str(tmp_path / "specs" / "ca.pem")
    source = plan.sources["events_jsonl"].source_class.create(
        "events_jsonl", plan.sources["events_jsonl"].parameters, plan.streams["events"], plan.base_dir)
    assert source.bad_records._path == tmp_path / "specs" / "bad.jsonl"


def test_letters_an_earlier_egress_wrote_at_the_current_folder_are_named_with_their_redrive(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    spec = relative_paths_spec(tmp_path, {"dead_letter_path": "dead.jsonl"})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dead.jsonl").write_text("")
    with caplog.at_level("WARNING", logger="egress.spec"):
        load_plan(spec)
    assert caplog.messages == [
        f"{spec}: computations/deliver/sinks/http/parameters/dead_letter_path: a relative path starts at the Spec's "
        f"folder: the sink now writes {tmp_path / 'specs' / 'dead.jsonl'}; the earlier lines in "
        f"{tmp_path / 'dead.jsonl'} stay there: egress redrive {tmp_path / 'dead.jsonl'} {spec} --sink deliver/http"]
    (tmp_path / "specs" / "dead.jsonl").write_text("")
    caplog.clear()
    with caplog.at_level("WARNING", logger="egress.spec"):
        load_plan(spec)  # once the Spec's folder has the file, the earlier one is history
    assert caplog.messages == []
