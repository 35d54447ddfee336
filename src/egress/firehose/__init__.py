"""The Amazon Data Firehose HTTP endpoint protocol: codec, a strict receiver, CloudWatch Logs records.

See ``docs/firehose.md``. Endpoint authors need :class:`FirehoseReceiver` (an aiohttp application),
a handler ``async def handle(request_id, records, common_attributes) -> None`` and the two errors it
may raise, :class:`PermanentError` (400) and :class:`TransientError` (503).
"""

from typing import TYPE_CHECKING

from egress.lazy import lazy_getattr

if TYPE_CHECKING:
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

# Exported lazily (PEP 562): the codec's users (the Firehose sink) import `egress.firehose.protocol`
# without the receiver's aiohttp; a name is imported from its module when first used.
_EXPORTS = {
    "FirehoseASGI": "egress.firehose.asgi",
    "CloudWatchLogsData": "egress.firehose.cloudwatch",
    "CloudWatchLogsDecodeError": "egress.firehose.cloudwatch",
    "decode_cloudwatch_logs": "egress.firehose.cloudwatch",
    "FirehoseError": "egress.firehose.errors",
    "PermanentError": "egress.firehose.errors",
    "RequestRejected": "egress.firehose.errors",
    "ResponseNotAccepted": "egress.firehose.errors",
    "TransientError": "egress.firehose.errors",
    "FirehoseRecord": "egress.firehose.protocol",
    "FirehoseRequest": "egress.firehose.protocol",
    "FirehoseResponse": "egress.firehose.protocol",
    "FirehoseReceiver": "egress.firehose.receiver",
    "Handler": "egress.firehose.receiver",
    "Incoming": "egress.firehose.receiver",
    "ReceiverOptions": "egress.firehose.receiver",
    "ReceiverStats": "egress.firehose.receiver",
    "serve": "egress.firehose.receiver",
}

__getattr__ = lazy_getattr(__name__, _EXPORTS)


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
