"""Sinks: the async HTTP sink (``NYT::NFlow::TAsyncHttpSink``), the Firehose HTTP endpoint sink and the
batching HTTP sink."""

from egress.connectors.sinks.async_http import AsyncHttpSink
from egress.connectors.sinks.batching_http import BatchingHttpSink
from egress.connectors.sinks.firehose_http import FirehoseHttpSink

__all__ = ["AsyncHttpSink", "BatchingHttpSink", "FirehoseHttpSink"]
