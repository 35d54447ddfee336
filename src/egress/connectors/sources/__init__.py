"""Sources: ``csv`` and ``jsonl`` files."""

from egress.connectors.sources.files import CsvSource, JsonlSource

__all__ = ["CsvSource", "JsonlSource"]
