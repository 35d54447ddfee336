"""What a source does with a record that does not fit its stream's schema: ``on_bad_record``.

``fail`` (the default) stops the run with the ``SourceDataError`` naming the input, the record's
place and the reason. ``skip`` drops the record and goes on; ``dead_letter`` first appends it to
``dead_letter_path`` (one JSON line, durable before the source goes on), then drops it. A dropped
record still takes its position (record number, stream sequence), so the message ids of the records
after it do not change. Skipped and dead-lettered records are counted (``egress_source_bad_records``
by source and action, and the run summary).

A source dead letter (keys always present)::

    {"dead_lettered_at": 1767225600.5, "source": "orders", "input": "data/orders.jsonl",
     "position": 17, "error": "data/orders.jsonl:19: not valid JSON (...)",
     "record": "<the line, or the message payload>", "record_encoding": "utf-8"}   # or "base64"

After a crash a bad record read again before its position was committed is not written twice: the
file's lines of this source are read when the source starts, and a record already there (same
source, input and position) is only counted.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel

from egress.clock import Clock, RealClock
from egress.errors import SourceDataError, SpecError
from egress.line_files import LineFile, read_lines

BadRecordAction = Literal["fail", "skip", "dead_letter"]


class BadRecordParameters(BaseModel):
    """``on_bad_record`` (``fail``, ``skip`` or ``dead_letter``) and, for ``dead_letter``,
    ``dead_letter_path`` (a file, relative to the Spec's folder; created with mode 0600)."""

    on_bad_record: BadRecordAction = "fail"
    dead_letter_path: str | None = None


def check_bad_record_parameters(parameters: BadRecordParameters, base_dir: Path) -> list[SpecError]:
    """``dead_letter`` needs a ``dead_letter_path`` in an existing folder; the path is used by nothing else."""
    errors = []
    if parameters.on_bad_record == "dead_letter":
        if parameters.dead_letter_path is None:
            errors.append(SpecError("on_bad_record: dead_letter needs dead_letter_path (the file bad records go to)",
                                    path="parameters/dead_letter_path"))
        elif (base_dir / parameters.dead_letter_path).is_dir():
            errors.append(SpecError(f"{base_dir / parameters.dead_letter_path} is a folder: name a file",
                                    path="parameters/dead_letter_path"))
        elif not (base_dir / parameters.dead_letter_path).parent.is_dir():
            errors.append(SpecError(f"folder not found: {(base_dir / parameters.dead_letter_path).parent}",
                                    path="parameters/dead_letter_path"))
    elif parameters.dead_letter_path is not None:
        errors.append(SpecError("dead_letter_path is used only with on_bad_record: dead_letter",
                                path="parameters/dead_letter_path"))
    return errors


class BadRecords:
    """The ``on_bad_record`` policy of one source, with its counts (``skipped``, ``dead_lettered``;
    read by the source reader for the metrics)."""

    def __init__(self, source_id: str, parameters: BadRecordParameters, base_dir: Path) -> None:
        self.source_id = source_id
        self.action = parameters.on_bad_record
        self.skipped = 0
        self.dead_lettered = 0
        self.clock: Clock = RealClock()  # stamps ``dead_lettered_at``; the reader's via use_clock
        self._file: LineFile | None = None
        self._written: set[tuple[str, int]] | None = None
        if self.action == "dead_letter" and parameters.dead_letter_path is not None:
            self._path = base_dir / parameters.dead_letter_path
            self._file = LineFile(self._path)

    def handle(self, error: SourceDataError, input_name: str, position: int, record: bytes | str) -> None:
        """Apply the policy to a bad ``record`` at ``position`` of ``input_name``: raise ``error``
        (``fail``), or count it and go on (after writing its dead letter)."""
        if self.action == "fail":
            raise error
        if self._file is None:
            self.skipped += 1
            return
        if (input_name, position) not in self._already_written():
            self._file.append(self._line(error, input_name, position, record))
            self._already_written().add((input_name, position))
        self.dead_lettered += 1

    def _already_written(self) -> set[tuple[str, int]]:
        if self._written is None:
            self._written = set()
            lines, _ = read_lines(self._path) if self._path.exists() else ([], 0)
            for line in lines:
                entry = orjson.loads(line)
                if entry.get("source") == self.source_id:
                    self._written.add((str(entry["input"]), int(entry["position"])))
        return self._written

    def _line(self, error: SourceDataError, input_name: str, position: int, record: bytes | str) -> bytes:
        data = record.encode() if isinstance(record, str) else record
        try:
            text, encoding = data.decode(), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(data).decode(), "base64"
        return orjson.dumps({"dead_lettered_at": self.clock.now(), "source": self.source_id, "input": input_name,
                             "position": position, "error": str(error), "record": text,
                             "record_encoding": encoding}) + b"\n"


class WithBadRecords:
    """The :class:`~egress.connectors.sources.live.UsesClock` member of a source with an
    ``on_bad_record`` policy (``bad_records``): its waits (``_clock``) and dead letters' timestamps
    follow the run's clock."""

    bad_records: BadRecords
    _clock: Clock = RealClock()

    def use_clock(self, clock: Clock) -> None:
        self._clock = clock
        self.bad_records.clock = clock
