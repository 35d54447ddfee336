"""Dead-letter lines and files: the line format, one line per outstanding message, coalesced appends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from egress.connectors import dead_letters as dl
from egress.connectors.dead_letters import (
    Attempt,
    DeadLetter,
    DeadLetterFileError,
    DeadLetterFiles,
    decode_dead_letter,
    encode_dead_letter,
    encode_redriven,
    read_dead_letters,
    redrive_record_path,
)


def letter(n: int = 1, payload: bytes = b'{"n":1}', sink: str = "http") -> DeadLetter:
    message_id = f"m{n}".encode()
    return DeadLetter("deliver", sink, 2, n, message_id, message_id.hex().upper(), payload,
                      (Attempt(10.0, 503), Attempt(11.5, error="curl error 7: Couldn't connect")),
                      "Async HTTP POST retry policy exhausted after 2 attempt(s); last error: curl error 7", 12.0)


def test_a_line_holds_every_field_and_decodes_to_the_same_letter() -> None:
    line = encode_dead_letter(letter())
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert json.loads(line) == {
        "dead_lettered_at": 12.0, "computation": "deliver", "sink": "http", "partition": 2, "seq": 1,
        "message_id": "6d31", "idempotency_key": "6D31", "payload": '{"n":1}', "payload_encoding": "utf-8",
        "attempts": [{"time": 10.0, "status": 503, "error": None},
                     {"time": 11.5, "status": None, "error": "curl error 7: Couldn't connect"}],
        "error": "Async HTTP POST retry policy exhausted after 2 attempt(s); last error: curl error 7",
    }
    assert decode_dead_letter(line) == letter()


def test_a_payload_that_is_not_utf8_is_kept_as_base64() -> None:
    raw = b"\xff\x00binary\n"
    line = json.loads(encode_dead_letter(letter(payload=raw)))
    assert line["payload_encoding"] == "base64"
    assert line["payload"] == "/wBiaW5hcnkK"
    assert decode_dead_letter(encode_dead_letter(letter(payload=raw))).payload == raw


@pytest.mark.parametrize(("line", "reason"), [
    (b"not json", "not JSON"),
    (b"[1]", "not a JSON object"),
    (b'{"payload": "x", "payload_encoding": "utf-8", "attempts": []}', "computation is missing"),
    (b'{"payload": "x", "payload_encoding": "rot13"}', "payload_encoding must be"),
    (b'{"payload": "!!", "payload_encoding": "base64"}', "not valid base64"),
])
def test_a_line_that_is_not_a_dead_letter_says_why(line: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        decode_dead_letter(line)


def test_reading_a_file_names_the_bad_line_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    path.write_bytes(encode_dead_letter(letter(1)) + b"{oops}\n")
    with pytest.raises(DeadLetterFileError, match=r"dead\.jsonl: line 2: not a dead letter \(not JSON\): .*remove"):
        read_dead_letters(path)
    with pytest.raises(DeadLetterFileError, match="no such dead-letter file"):
        read_dead_letters(tmp_path / "missing.jsonl")


def test_reading_a_file_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    path.write_bytes(encode_dead_letter(letter(1)) + encode_dead_letter(letter(2))[:30])
    assert read_dead_letters(path) == ([letter(1)], 30)


async def test_appends_of_one_loop_turn_share_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "dead.jsonl"
    writes: list[bytes] = []
    real_append = dl.LineFile.append

    def counted(self: dl.LineFile, lines: bytes) -> None:
        writes.append(lines)
        real_append(self, lines)

    monkeypatch.setattr(dl.LineFile, "append", counted)
    files = DeadLetterFiles()
    first, second = files.open(path), files.open(tmp_path / "." / "dead.jsonl")
    assert first is second  # one writer per path
    results = [first.append([letter(1)]), second.append([letter(2), letter(3, sink="other")])]
    assert [await result for result in results] == [1, 2]
    assert len(writes) == 1
    assert [line.seq for line in read_dead_letters(path)[0]] == [1, 2, 3]
    assert files.status()["written"] == 3
    assert files.status()["latest"]["seq"] == 3
    assert files.status()["latest"]["path"] == str(path)


async def test_a_message_with_an_outstanding_line_is_not_written_again(tmp_path: Path) -> None:
    """A crash between the line and the committed acknowledgement delivers the message again; if it
    fails again, the restarted run (a new DeadLetterFiles) must not write a second line."""
    path = tmp_path / "dead.jsonl"
    assert await DeadLetterFiles().open(path).append([letter(1), letter(2)]) == 2
    again = DeadLetterFiles()
    assert await again.open(path).append([letter(2), letter(3)]) == 1
    assert await again.open(path).append([letter(3)]) == 0
    assert [line.seq for line in read_dead_letters(path)[0]] == [1, 2, 3]
    assert again.written == 1


async def test_a_message_redriven_already_gets_a_new_line_when_it_fails_again(tmp_path: Path) -> None:
    """A later run (a fresh state directory) may fail the same message again after its line was redriven:
    that is a new dead letter, or the message would be lost."""
    path = tmp_path / "dead.jsonl"
    await DeadLetterFiles().open(path).append([letter(1), letter(2)])
    redrive_record_path(path).write_bytes(encode_redriven(letter(1), 20.0))
    assert await DeadLetterFiles().open(path).append([letter(1), letter(2)]) == 1
    assert [line.seq for line in read_dead_letters(path)[0]] == [1, 2, 1]


async def test_a_file_that_cannot_be_written_fails_the_append(tmp_path: Path) -> None:
    output = DeadLetterFiles().open(tmp_path / "no-such-folder" / "dead.jsonl")
    with pytest.raises(FileNotFoundError):
        await output.append([letter(1)])


async def test_an_unreadable_redrive_record_fails_the_append_rather_than_guess(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    redrive_record_path(path).write_bytes(b"garbage\n")
    with pytest.raises(DeadLetterFileError, match=r"dead\.jsonl\.redriven: line 1: not a redrive record"):
        await DeadLetterFiles().open(path).append([letter(1)])
    assert not path.exists()


async def test_the_first_letter_of_each_sink_and_file_is_kept_for_egress_run_to_print(tmp_path: Path) -> None:
    files = DeadLetterFiles()
    here, there = files.open(tmp_path / "here.jsonl"), files.open(tmp_path / "there.jsonl")
    await here.append([letter(1), letter(2, sink="other"), letter(3)])
    await there.append([letter(4)])
    await here.append([letter(5, sink="other")])
    assert {(path.name, sink): found.seq for (path, sink), found in files.first.items()} == {
        ("here.jsonl", "deliver/http"): 1, ("here.jsonl", "deliver/other"): 2, ("there.jsonl", "deliver/http"): 4}
