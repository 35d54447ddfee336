"""Decoding CloudWatch Logs subscription records delivered through Firehose.

A CloudWatch Logs subscription filter sends each record as a gzip'd JSON document (magic bytes
``1f 8b``); Firehose may also deliver it decompressed when its decompression option is on. Source:
AWS CloudWatch Logs "Subscription filters" (log data format) and docs/firehose.md ("CloudWatch Logs
subscription records"). Short inputs (0, 1 or 2 bytes) are errors, never an index error (Grafana
Alloy indexed bytes 0..2 without a length check).
"""

from __future__ import annotations

from typing import Annotated

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from egress.firehose.errors import PermanentError, RequestRejected
from egress.firehose.protocol import MAX_RECORD_BYTES, gunzip

GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_MAX_DECOMPRESSED_BYTES = 16 * MAX_RECORD_BYTES
"""Cap on one record's decompressed size (bytes): a gzip bomb stops there."""


class CloudWatchLogsDecodeError(PermanentError):
    """A record is not a CloudWatch Logs subscription document (not gzip'd JSON of that shape, or
    larger than the cap once decompressed). A :class:`PermanentError`: raised from a receiver
    handler, the receiver answers 400 with its message."""


class LogEvent(BaseModel):
    """One log event: ``id``, ``timestamp`` (ms since the epoch), ``message``."""

    model_config = ConfigDict(frozen=True, extra="allow")
    id: StrictStr
    timestamp: StrictInt
    message: StrictStr


class CloudWatchLogsData(BaseModel):
    """A subscription document. ``messageType`` is ``DATA_MESSAGE`` (log events) or
    ``CONTROL_MESSAGE`` (CloudWatch's reachability check, no events worth keeping)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    messageType: StrictStr
    owner: StrictStr = ""
    logGroup: StrictStr = ""
    logStream: StrictStr = ""
    subscriptionFilters: list[StrictStr] = Field(default_factory=list)
    logEvents: Annotated[list[LogEvent], Field(default_factory=list)]

    @property
    def is_control_message(self) -> bool:
        return self.messageType == "CONTROL_MESSAGE"


def decode_cloudwatch_logs(record: bytes, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
                           ) -> CloudWatchLogsData:
    """Decode one Firehose record (already base64-decoded) from a CloudWatch Logs subscription.

    Gzip'd records (starting with ``1f 8b``) are decompressed, at most ``max_decompressed_bytes``
    bytes; others are parsed as JSON directly. Raises :class:`CloudWatchLogsDecodeError` for an
    empty or too short record, corrupt gzip, output over the cap, invalid JSON, or a document
    without ``messageType`` or with fields of the wrong type.
    """
    if len(record) < 2:
        raise CloudWatchLogsDecodeError(f"record of {len(record)} byte(s) is not a CloudWatch Logs document")
    data = record
    if record[:2] == GZIP_MAGIC:
        try:
            data = gunzip(record, max_decompressed_bytes)
        except RequestRejected as error:
            reason = "too large once decompressed" if error.status == 413 else "corrupt gzip"
            raise CloudWatchLogsDecodeError(f"CloudWatch Logs record: {reason}") from None
    try:
        return CloudWatchLogsData.model_validate(orjson.loads(data))
    except orjson.JSONDecodeError as error:
        raise CloudWatchLogsDecodeError(f"CloudWatch Logs record is not JSON: {error}") from None
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = "/".join(str(part) for part in first.get("loc", ()))
        raise CloudWatchLogsDecodeError(f"CloudWatch Logs record: {where}: {first['msg']}") from None
