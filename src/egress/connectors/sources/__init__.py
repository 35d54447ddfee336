"""Sources: ``csv`` and ``jsonl`` files (followed or not), ``nats`` (a JetStream stream), ``http`` (POSTs)."""

from egress.connectors.sources.files import CsvSource, JsonlSource
from egress.connectors.sources.http import HttpSource
from egress.connectors.sources.nats import NatsSource

__all__ = ["CsvSource", "HttpSource", "JsonlSource", "NatsSource"]
