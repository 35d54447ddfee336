"""A file source's committed position belongs to one file: its identity (inode and a fingerprint
of its first bytes) commits with the position on every engine, and a one-shot run refuses a file
that was replaced or shortened since, instead of resuming by record number and skipping rows."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from egress.connectors.sources.identity import CHANGED_FILE_FIX
from egress.engines import Engine
from egress.errors import SourceChangedError
from egress.receiver import Receiver
from egress.runtime import Pipeline, RunOptions, RunResult, load_plan
from tests.conftest import ServerFactory, payload_spec
from tests.engines.engines import ENGINES

pytestmark = pytest.mark.integration


def _lines(start: int, count: int, width: int = 0) -> bytes:
    return b"".join(orjson.dumps({"id": i, "payload": f"p{i}".ljust(width, ".")}) + b"\n"
                    for i in range(start, start + count))


def _write_in_place(path: Path, data: bytes, *, truncate: bool) -> None:
    """Write ``data`` into the same inode: after truncating it, or appended."""
    with open(path, "r+b" if truncate else "ab") as file:
        if truncate:
            file.truncate(0)
        file.write(data)


async def _run(engine_name: str, tmp_path: Path, spec: Path, dynamic: Path) -> RunResult:
    def factory(state_dir: Path, pipeline: str, options: RunOptions) -> Engine:
        return ENGINES[engine_name](state_dir, pipeline)

    return await Pipeline(load_plan(spec, dynamic), tmp_path / "state", options=RunOptions(until_drained=True),
                          engine_factory=factory).run()


@pytest.fixture
async def first_run(engine_name: str, tmp_path: Path, serve_app: ServerFactory) -> tuple[Receiver, Path, Path]:
    """Five records read and delivered once; returns the receiver and the spec files."""
    receiver = Receiver()
    base = await serve_app(receiver.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [])
    (tmp_path / "payloads.jsonl").write_bytes(_lines(0, 5))
    result = await _run(engine_name, tmp_path, spec, dynamic)
    assert result.ok
    assert result.drained
    assert receiver.stats.requests == 5
    return receiver, spec, dynamic


async def test_a_file_replaced_between_runs_is_refused_naming_the_file_and_the_fix(
        engine_name: str, tmp_path: Path, first_run: tuple[Receiver, Path, Path]) -> None:
    receiver, spec, dynamic = first_run
    data = tmp_path / "payloads.jsonl"
    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(_lines(100, 8))  # more rows than were read: by record number, 3 would be sent
    os.replace(replacement, data)
    result = await _run(engine_name, tmp_path, spec, dynamic)
    assert isinstance(result.error, SourceChangedError)
    message = str(result.error)
    assert str(data) in message
    assert "replaced" in message
    assert "5 record(s)" in message
    assert message.endswith(CHANGED_FILE_FIX)  # put the read file back, or start over (a state directory, a bucket)
    assert receiver.stats.requests == 5


async def test_a_file_rewritten_in_place_with_other_rows_is_refused(
        engine_name: str, tmp_path: Path, first_run: tuple[Receiver, Path, Path]) -> None:
    receiver, spec, dynamic = first_run
    data = tmp_path / "payloads.jsonl"
    _write_in_place(data, _lines(100, 8), truncate=True)  # same inode, other content
    result = await _run(engine_name, tmp_path, spec, dynamic)
    assert isinstance(result.error, SourceChangedError)
    assert "rewritten or truncated" in str(result.error)
    assert receiver.stats.requests == 5


async def test_a_file_shortened_past_its_fingerprint_is_refused(
        engine_name: str, tmp_path: Path, serve_app: ServerFactory) -> None:
    receiver = Receiver()
    base = await serve_app(receiver.app)
    spec, dynamic = payload_spec(tmp_path, f"{base}/events", [])
    data = tmp_path / "payloads.jsonl"
    data.write_bytes(_lines(0, 40, width=500))  # ~20 kB: the fingerprint covers the first 4 kB only
    assert (await _run(engine_name, tmp_path, spec, dynamic)).ok
    os.truncate(data, len(_lines(0, 30, width=500)))
    result = await _run(engine_name, tmp_path, spec, dynamic)
    assert isinstance(result.error, SourceChangedError)
    assert "shortened (it now holds 30 record(s))" in str(result.error)
    assert receiver.stats.requests == 40


async def test_rows_appended_between_runs_are_read_and_nothing_is_sent_twice(
        engine_name: str, tmp_path: Path, first_run: tuple[Receiver, Path, Path]) -> None:
    receiver, spec, dynamic = first_run
    _write_in_place(tmp_path / "payloads.jsonl", _lines(5, 3), truncate=False)
    result = await _run(engine_name, tmp_path, spec, dynamic)
    assert result.ok
    assert result.drained
    assert receiver.stats.requests == 8
