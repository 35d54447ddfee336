"""Sinks: the async HTTP sink (``NYT::NFlow::TAsyncHttpSink``)."""

from egress.connectors.sinks.async_http import AsyncHttpSink

__all__ = ["AsyncHttpSink"]
