"""Sources: ``csv`` and ``jsonl`` files, ``nats`` (a JetStream stream)."""

from egress.connectors.sources.files import CsvSource, JsonlSource
from egress.connectors.sources.nats import NatsSource

__all__ = ["CsvSource", "JsonlSource", "NatsSource"]
