"""Sinks: the async HTTP sink (``NYT::NFlow::TAsyncHttpSink``) and the Firehose HTTP endpoint sink."""

from egress.connectors.sinks.async_http import AsyncHttpSink
from egress.connectors.sinks.firehose_http import FirehoseHttpSink

__all__ = ["AsyncHttpSink", "FirehoseHttpSink"]
