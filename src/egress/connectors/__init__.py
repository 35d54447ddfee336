"""Sources and sinks, registered by class name. Importing this package declares them all; a
connector's module is imported when its name is first looked up (``Registry.get``)."""

from egress.connectors import sinks, sources
from egress.connectors.base import SINKS, SOURCES, Registry, SinkContext, SourceRecord

# Each module and the names its `register` gives (tests/unit/test_public_namespace.py checks them).
SOURCES.declare("egress.connectors.sources.files", "csv")
SOURCES.declare("egress.connectors.sources.files", "jsonl")
SOURCES.declare("egress.connectors.sources.files", "lines")
SOURCES.declare("egress.connectors.sources.http", "http", "NYT::NFlow::THttpSource")
SOURCES.declare("egress.connectors.sources.nats", "nats", "NYT::NFlow::TNatsSource")
SINKS.declare("egress.connectors.sinks.async_http", "NYT::NFlow::TAsyncHttpSink", "async_http")
SINKS.declare("egress.connectors.sinks.batching_http", "batching_http", "NYT::NFlow::TBatchingHttpSink")
SINKS.declare("egress.connectors.sinks.firehose_http", "firehose_http", "NYT::NFlow::TFirehoseHttpSink")
SINKS.declare("egress.connectors.sinks.webhook_http", "webhook_http", "NYT::NFlow::TWebhookHttpSink")

__all__ = ["SINKS", "SOURCES", "Registry", "SinkContext", "SourceRecord", "sinks", "sources"]
