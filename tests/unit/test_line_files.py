"""Append-only line files: complete lines only, durable appends, torn tails cut, one holder at a time."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from egress import line_files
from egress.line_files import LineFile, LineFileBusy, read_lines


def test_append_creates_the_file_for_its_owner_only_and_adds_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "letters.jsonl"
    file = LineFile(path)
    file.append(b'{"a":1}\n')
    file.append(b'{"b":2}\n{"c":3}\n')
    assert path.read_bytes() == b'{"a":1}\n{"b":2}\n{"c":3}\n'
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_lines(path) == ([b'{"a":1}', b'{"b":2}', b'{"c":3}'], 0)


def test_a_torn_last_line_is_not_read_and_is_cut_before_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "letters.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":')  # a crash in the middle of an append
    assert read_lines(path) == ([b'{"a":1}'], 5)
    LineFile(path).append(b'{"c":3}\n')
    assert path.read_bytes() == b'{"a":1}\n{"c":3}\n'


def test_a_file_holding_only_a_torn_line_is_emptied_before_the_append(tmp_path: Path) -> None:
    path = tmp_path / "letters.jsonl"
    path.write_bytes(b"x" * 200_000)  # longer than one tail chunk, no newline at all
    LineFile(path).append(b"ok\n")
    assert path.read_bytes() == b"ok\n"


def test_a_failed_write_leaves_no_part_of_its_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "letters.jsonl"
    file = LineFile(path)
    file.append(b"first\n")
    real_write = os.write

    def half_then_full_disk(fd: int, data: bytes | memoryview) -> int:
        if len(data) > 4:
            return real_write(fd, bytes(data[:4]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(line_files.os, "write", half_then_full_disk)
    with pytest.raises(OSError, match="No space left"):
        file.append(b"second line\n")
    monkeypatch.undo()
    assert path.read_bytes() == b"first\n"


def test_only_complete_lines_are_accepted(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="complete lines"):
        LineFile(tmp_path / "x").append(b"no newline")


def test_a_held_file_refuses_a_second_holder_and_still_takes_appends(tmp_path: Path) -> None:
    path = tmp_path / "record.jsonl"
    first = LineFile(path)
    with first.exclusively():
        with pytest.raises(LineFileBusy), LineFile(path).exclusively():
            pass
        first.append(b"held\n")
    with LineFile(path).exclusively():  # released at the end of the block
        pass
    assert path.read_bytes() == b"held\n"
