"""The Amazon Data Firehose HTTP endpoint protocol: codec, a strict receiver, CloudWatch Logs records.

See ``docs/firehose.md``. Endpoint authors need :class:`FirehoseReceiver` (an aiohttp application),
a handler ``async def handle(request_id, records, common_attributes) -> None`` and the two errors it
may raise, :class:`PermanentError` (400) and :class:`TransientError` (503).
"""

from egress.firehose.asgi import FirehoseASGI
from egress.firehose.cloudwatch import CloudWatchLogsData, CloudWatchLogsDecodeError, decode_cloudwatch_logs
from egress.firehose.errors import (
    FirehoseError,
    PermanentError,
    RequestRejected,
    ResponseNotAccepted,
    TransientError,
)
from egress.firehose.protocol import FirehoseRecord, FirehoseRequest, FirehoseResponse
from egress.firehose.receiver import FirehoseReceiver, Handler, Incoming, ReceiverOptions, ReceiverStats, serve

__all__ = [
    "CloudWatchLogsData",
    "CloudWatchLogsDecodeError",
    "FirehoseASGI",
    "FirehoseError",
    "FirehoseReceiver",
    "FirehoseRecord",
    "FirehoseRequest",
    "FirehoseResponse",
    "Handler",
    "Incoming",
    "PermanentError",
    "ReceiverOptions",
    "ReceiverStats",
    "RequestRejected",
    "ResponseNotAccepted",
    "TransientError",
    "decode_cloudwatch_logs",
    "serve",
]
