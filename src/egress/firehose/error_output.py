"""The sender's error output: records that exhausted their retries or got a 413, as JSON lines.

One line per record with Firehose's error-record fields (docs/firehose.md, "Sender"): ``attemptsMade``,
``arrivalTimestamp`` (ms, when the record reached the sink), ``errorCode``, ``errorMessage`` (the last
response body or error, always a JSON string, so every line is valid JSON — unlike the AWS example,
which embeds the response unescaped), ``attemptEndingTimestamp`` (ms) and ``rawData`` (base64).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson

from egress.firehose.protocol import MAX_ERROR_MESSAGE_CHARS, b64encode_record
from egress.line_files import LineFile

# Firehose's error codes for HTTP endpoint destinations.
DESTINATION_EXCEPTION = "HttpEndpoint.DestinationException"
INVALID_RESPONSE = "HttpEndpoint.InvalidResponseFromDestination"
REQUEST_TIMEOUT = "HttpEndpoint.RequestTimeout"
RESPONSE_TOO_LARGE = "HttpEndpoint.ResponseTooLarge"
CONNECTION_FAILED = "HttpEndpoint.ConnectionFailed"
RECORD_TOO_LARGE = "HttpEndpoint.RecordTooLarge"  # egress: a record over 1,024,000 bytes is never sent


def error_lines(records: Sequence[bytes], arrivals_ms: Sequence[int], *, attempts: int, error_code: str,
                error_message: str, ending_ms: int) -> bytes:
    """The JSON lines (newline-terminated, UTF-8) for ``records``; ``arrivals_ms[i]`` belongs to ``records[i]``."""
    message = error_message[:MAX_ERROR_MESSAGE_CHARS].encode("utf-8", "replace").decode("utf-8")
    return b"".join(orjson.dumps({
        "attemptsMade": attempts, "arrivalTimestamp": arrival, "errorCode": error_code, "errorMessage": message,
        "attemptEndingTimestamp": ending_ms, "rawData": b64encode_record(record),
    }) + b"\n" for record, arrival in zip(records, arrivals_ms, strict=True))


class ErrorOutput:
    """Appends error lines to ``path`` and makes them durable (fsync) before returning, so a batch is
    acknowledged only once its error records are on disk. Raises ``OSError`` if it cannot write.

    The file is an :class:`egress.line_files.LineFile`, like the dead-letter files: one write per
    batch under a file lock, and a line torn by a crash is cut off before the next append. A crash
    after the write and before the batch's acknowledgement is committed writes the batch's lines
    again after the restart (at-least-once: these lines carry no message id to deduplicate on).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = LineFile(self.path)

    def write(self, lines: bytes) -> None:
        self._file.append(lines)
