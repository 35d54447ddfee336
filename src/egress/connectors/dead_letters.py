"""Dead letters: deliveries of the HTTP sinks that failed for good, kept in a file to redrive later.

With ``dead_letter_path`` set on an HTTP sink (``async_http``, ``firehose_http``, ``batching_http``,
``webhook_http``), a delivery that exhausts its attempts or its deadline (or, in the Firehose sink,
gets a 413 or holds a record over the protocol's limit) does not block its partition: it is appended
to the file as one JSON line per message, durably (``fsync``), and only then acknowledged, so the
partition goes on. ``egress redrive`` re-sends the lines through a sink later (``egress.runtime.redrive``).

A line (keys always present; ``status`` and ``error`` of an attempt are ``null`` when absent)::

    {"dead_lettered_at": 1767225600.5, "computation": "deliver", "sink": "http", "partition": 0,
     "seq": 17, "message_id": "<lower-case hex>", "idempotency_key": "<the key the sink sent>",
     "payload": "<text>", "payload_encoding": "utf-8",          # "base64" when not UTF-8
     "attempts": [{"time": 1767225599.0, "status": 503, "error": null}, ...],
     "error": "Async HTTP POST retry policy exhausted after 3 attempt(s); last error: HTTP status 503"}

A webhook sink's line (``webhook_http``) also has ``"endpoint"``: the value of its ``url_column``
(the URL) or ``endpoint_column`` (the name in the DynamicSpec's endpoint table), where a redrive
sends it back; the other sinks' lines have no such key.

Times are seconds since the Unix epoch from the pipeline's clock; an attempt's ``time`` is when it
ended. The async HTTP sink's idempotency key is the upper-case hex of the message id; the Firehose
sink's is the batch's ``X-Amz-Firehose-Request-Id``, shared by the records of one batch.

No duplicates after a crash: a message is acknowledged only in an epoch committed after its line was
written, so a crash in between delivers it again after the restart, and it may fail again. A file
therefore writes a message's line only when it has no outstanding line yet: one not matched by a line
of its redrive record (``<file>.redriven``, written by ``egress redrive``). The key of a message is
(computation, sink, message id), so sinks sharing a file never hide each other's letters.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from egress.errors import EgressError, SpecError
from egress.line_files import LineFile, read_lines

REDRIVEN_SUFFIX = ".redriven"

LetterKey = tuple[str, str, bytes]
"""What identifies a dead letter's message: (computation id, sink id, message id)."""


class DeadLetterFileError(EgressError):
    """A dead-letter file or its redrive record cannot be read or holds a line that is not one;
    the message names the file, the line and the fix."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One failed attempt: when it ended (seconds since the Unix epoch), and the HTTP status that
    failed it or the error (transport error, timeout, a response that does not conform)."""

    time: float
    status: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message whose delivery failed for good (the module docs show its line)."""

    computation: str
    sink: str
    partition: int
    seq: int
    message_id: bytes
    idempotency_key: str
    payload: bytes
    attempts: tuple[Attempt, ...]
    error: str
    dead_lettered_at: float
    endpoint: str | None = None  # a webhook sink's endpoint (its URL or table name); None for the others

    @property
    def key(self) -> LetterKey:
        return (self.computation, self.sink, self.message_id)

    def summary(self) -> dict[str, Any]:
        """The line's fields without the payload, ``attempts`` as their count (for ``/status``)."""
        return {"dead_lettered_at": self.dead_lettered_at, "computation": self.computation, "sink": self.sink,
                "partition": self.partition, "seq": self.seq, "message_id": self.message_id.hex(),
                "idempotency_key": self.idempotency_key, "attempts": len(self.attempts), "error": self.error}


def encode_dead_letter(letter: DeadLetter) -> bytes:
    """The JSON line of ``letter``, newline included."""
    try:
        payload, encoding = letter.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(letter.payload).decode("ascii"), "base64"
    line: dict[str, Any] = {
        "dead_lettered_at": letter.dead_lettered_at, "computation": letter.computation, "sink": letter.sink,
        "partition": letter.partition, "seq": letter.seq, "message_id": letter.message_id.hex(),
        "idempotency_key": letter.idempotency_key, "payload": payload, "payload_encoding": encoding,
        "attempts": [{"time": a.time, "status": a.status, "error": a.error} for a in letter.attempts],
        "error": letter.error,
    }
    if letter.endpoint is not None:
        line["endpoint"] = letter.endpoint
    return orjson.dumps(line) + b"\n"


def decode_dead_letter(line: bytes) -> DeadLetter:
    """The inverse of :func:`encode_dead_letter`. Raises ``ValueError`` saying what is wrong."""
    data = _json_object(line)
    encoding = _field(data, "payload_encoding", str)
    payload = _field(data, "payload", str)
    if encoding == "utf-8":
        raw = payload.encode("utf-8")
    elif encoding == "base64":
        try:
            raw = base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise ValueError("payload is not valid base64") from None
    else:
        raise ValueError(f'payload_encoding must be "utf-8" or "base64", not {encoding!r}')
    attempts = _field(data, "attempts", list)
    if not all(isinstance(a, dict) for a in attempts):
        raise ValueError("attempts must be a list of objects")
    endpoint = data.get("endpoint")
    if endpoint is not None and not isinstance(endpoint, str):
        raise ValueError("endpoint is not a string")
    return DeadLetter(
        _field(data, "computation", str), _field(data, "sink", str), _field(data, "partition", int),
        _field(data, "seq", int), _message_id(data), _field(data, "idempotency_key", str), raw,
        tuple(Attempt(float(a.get("time") or 0.0), a.get("status"), a.get("error")) for a in attempts),
        _field(data, "error", str), float(_field(data, "dead_lettered_at", (int, float))), endpoint)


def letter_key(line: bytes) -> LetterKey:
    """The key of a dead-letter line or of a redrive-record line. Raises ``ValueError``."""
    data = _json_object(line)
    return (_field(data, "computation", str), _field(data, "sink", str), _message_id(data))


def encode_redriven(letter: DeadLetter, redriven_at: float) -> bytes:
    """The redrive-record line saying ``letter`` was delivered by ``egress redrive``."""
    return orjson.dumps({"redriven_at": redriven_at, "computation": letter.computation, "sink": letter.sink,
                         "message_id": letter.message_id.hex(), "idempotency_key": letter.idempotency_key}) + b"\n"


def redrive_record_path(path: str | Path) -> Path:
    """Where ``egress redrive`` records what it delivered from the dead-letter file ``path``."""
    return Path(f"{path}{REDRIVEN_SUFFIX}")


def redriven_counts(path: str | Path) -> collections.Counter[LetterKey]:
    """How many times each message of the dead-letter file ``path`` was redriven (its record's
    lines; none when the record does not exist). Raises :class:`DeadLetterFileError`."""
    record = redrive_record_path(path)
    counts: collections.Counter[LetterKey] = collections.Counter()
    for number, line in _numbered_lines(record):
        try:
            counts[letter_key(line)] += 1
        except ValueError as error:
            raise DeadLetterFileError(f"{record}: line {number}: not a redrive record ({error}): egress redrive "
                                      "writes this file; restore it or remove the line") from None
    return counts


def check_dead_letter_path(path: str | None) -> list[SpecError]:
    """Spec check of a sink's ``dead_letter_path``: its folder must exist and the path must not be a
    directory (the plan makes a relative path start at the Spec's folder)."""
    if path is None:
        return []
    folder = Path(path).parent
    if not folder.is_dir():
        return [SpecError(f'folder "{folder}" of the dead-letter file does not exist: create it, or point '
                          "dead_letter_path into an existing folder", path="parameters/dead_letter_path")]
    if Path(path).is_dir():
        return [SpecError(f'"{path}" is a directory, not a file: point dead_letter_path at a file in it, e.g. '
                          "dead_letters.jsonl", path="parameters/dead_letter_path")]
    return []


class DeadLetterOutput(Protocol):
    """Where a sink appends its dead letters (a :class:`DeadLetterFile` in a run)."""

    @property
    def path(self) -> Path: ...

    def append(self, letters: Sequence[DeadLetter]) -> asyncio.Future[int]:
        """Make ``letters`` durable; the future's result is how many lines were written (a message with
        an outstanding line is not written again), or ``OSError`` when they could not be."""
        ...


class DeadLetterFile:
    """One dead-letter file of a run, shared by every sink instance that names it.

    Appends made in one event-loop turn are written together, with one ``write`` and one ``fsync``
    (:class:`egress.line_files.LineFile`), however many partitions they come from. The keys already
    in the file and its redrive record are read at the first append (the file may have grown in an
    earlier run), then kept up to date in memory: a count per message key.
    """

    def __init__(self, path: Path, on_written: Callable[[DeadLetter, Path], None]) -> None:
        self.path = path
        self._file = LineFile(path)
        self._on_written = on_written
        self._queue: list[tuple[Sequence[DeadLetter], asyncio.Future[int]]] = []
        self._outstanding: collections.Counter[LetterKey] | None = None  # lines not yet redriven, by key

    def append(self, letters: Sequence[DeadLetter]) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        if not self._queue:
            loop.call_soon(self._flush)
        self._queue.append((letters, future))
        return future

    def _flush(self) -> None:
        queue, self._queue = self._queue, []
        try:
            outstanding = self._load()
            written: list[list[DeadLetter]] = []
            for letters, _ in queue:
                fresh = [letter for letter in letters if not outstanding[letter.key]]
                for letter in fresh:
                    outstanding[letter.key] += 1
                written.append(fresh)
            try:
                self._file.append(b"".join(encode_dead_letter(letter) for fresh in written for letter in fresh))
            except OSError:
                for fresh in written:
                    for letter in fresh:
                        outstanding[letter.key] -= 1
                raise
        except (OSError, DeadLetterFileError) as error:  # the sinks stop rather than lose these letters
            for _, future in queue:
                if not future.done():
                    future.set_exception(error)
            return
        for (_, future), fresh in zip(queue, written, strict=True):
            for letter in fresh:
                self._on_written(letter, self.path)
            if not future.done():
                future.set_result(len(fresh))

    def _load(self) -> collections.Counter[LetterKey]:
        """The outstanding lines by key. Raises ``OSError`` or :class:`DeadLetterFileError` (an unreadable
        redrive record: guessing what it held could drop a message that needs a new line)."""
        if self._outstanding is None:
            outstanding: collections.Counter[LetterKey] = collections.Counter()
            for _, line in _numbered_lines(self.path):
                try:
                    outstanding[letter_key(line)] += 1
                except ValueError:
                    continue  # not a dead letter: it cannot stand for a message
            outstanding.subtract(redriven_counts(self.path))
            self._outstanding = collections.Counter({k: n for k, n in outstanding.items() if n > 0})
        return self._outstanding


class DeadLetterFiles:
    """The dead-letter files of one run by path (one :class:`DeadLetterFile` per path), with the
    number of lines written (in all, and by file and ``computation/sink``), the first line of each
    file and ``computation/sink`` (what ``egress run`` prints while it runs) and the latest one, for
    ``/status`` and the end of ``egress run``."""

    def __init__(self) -> None:
        self._files: dict[Path, DeadLetterFile] = {}
        self.written = 0
        self.by_file: collections.Counter[tuple[Path, str]] = collections.Counter()
        self.first: dict[tuple[Path, str], DeadLetter] = {}
        self.latest: tuple[DeadLetter, Path] | None = None

    def open(self, path: str | Path) -> DeadLetterOutput:
        """The output for ``path`` (nothing is read or written before its first append)."""
        resolved = Path(path).absolute()
        found = self._files.get(resolved)
        if found is None:
            found = self._files[resolved] = DeadLetterFile(Path(path), self._written)
        return found

    def _written(self, letter: DeadLetter, path: Path) -> None:
        self.written += 1
        self.by_file[(path, f"{letter.computation}/{letter.sink}")] += 1
        self.first.setdefault((path, f"{letter.computation}/{letter.sink}"), letter)
        self.latest = (letter, path)

    def status(self) -> dict[str, Any]:
        """``{"written": N, "latest": {"path": ..., <DeadLetter.summary()>} or None}``."""
        latest = None if self.latest is None else {"path": str(self.latest[1]), **self.latest[0].summary()}
        return {"written": self.written, "latest": latest}


def read_dead_letters(path: str | Path) -> tuple[list[DeadLetter], int]:
    """Every dead letter of the file ``path``, in order, and the byte count of a torn last line (a
    line being written, or cut by a crash; not a letter). Raises :class:`DeadLetterFileError`."""
    letters = []
    for number, line in _numbered_lines(path, missing_ok=False):
        try:
            letters.append(decode_dead_letter(line))
        except ValueError as error:
            raise DeadLetterFileError(f"{path}: line {number}: not a dead letter ({error}): the file must hold the "
                                      "lines a sink's dead_letter_path received; remove or fix that line") from None
    try:
        _, torn = read_lines(path)
    except OSError:
        torn = 0
    return letters, torn


def _numbered_lines(path: str | Path, *, missing_ok: bool = True) -> Iterator[tuple[int, bytes]]:
    try:
        lines, _ = read_lines(path)
    except FileNotFoundError:
        if missing_ok:
            return
        raise DeadLetterFileError(f"{path}: no such dead-letter file: give the file the sink's dead_letter_path names "
                                  "(a relative dead_letter_path starts at the Spec's folder, this path at the current "
                                  "folder)") from None
    except OSError as error:
        raise DeadLetterFileError(f"{path}: cannot read it: {error.strerror}") from None
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield number, line


def _json_object(line: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise ValueError("not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{name} is missing or not a {getattr(kind, '__name__', 'number')}")
    return value


def _message_id(data: dict[str, Any]) -> bytes:
    text = _field(data, "message_id", str)
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError("message_id is not hex") from None


__all__ = [
    "Attempt",
    "DeadLetter",
    "DeadLetterFile",
    "DeadLetterFileError",
    "DeadLetterFiles",
    "DeadLetterOutput",
    "check_dead_letter_path",
    "decode_dead_letter",
    "encode_dead_letter",
    "encode_redriven",
    "read_dead_letters",
    "redrive_record_path",
    "redriven_counts",
]
