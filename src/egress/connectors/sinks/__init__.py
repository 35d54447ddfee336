"""Sinks: the async HTTP sink (``NYT::NFlow::TAsyncHttpSink``), the Firehose HTTP endpoint sink and the
batching HTTP sink."""

from typing import TYPE_CHECKING

from egress.lazy import lazy_getattr

if TYPE_CHECKING:
    from egress.connectors.sinks.async_http import AsyncHttpSink
    from egress.connectors.sinks.batching_http import BatchingHttpSink
    from egress.connectors.sinks.firehose_http import FirehoseHttpSink

# Exported lazily (PEP 562): a run imports only the sinks its Spec names (`egress.connectors` declares them).
_EXPORTS = {
    "AsyncHttpSink": "egress.connectors.sinks.async_http",
    "BatchingHttpSink": "egress.connectors.sinks.batching_http",
    "FirehoseHttpSink": "egress.connectors.sinks.firehose_http",
}

__getattr__ = lazy_getattr(__name__, _EXPORTS)

__all__ = ["AsyncHttpSink", "BatchingHttpSink", "FirehoseHttpSink"]
