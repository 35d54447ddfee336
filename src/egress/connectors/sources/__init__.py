"""Sources: ``csv`` and ``jsonl`` files (followed or not), ``nats`` (a JetStream stream), ``http`` (POSTs)."""

from typing import TYPE_CHECKING

from egress.lazy import lazy_getattr

if TYPE_CHECKING:
    from egress.connectors.sources.files import CsvSource, JsonlSource
    from egress.connectors.sources.http import HttpSource
    from egress.connectors.sources.nats import NatsSource

# Exported lazily (PEP 562): a run imports only the sources its Spec names (`egress.connectors` declares them).
_EXPORTS = {
    "CsvSource": "egress.connectors.sources.files",
    "JsonlSource": "egress.connectors.sources.files",
    "HttpSource": "egress.connectors.sources.http",
    "NatsSource": "egress.connectors.sources.nats",
}

__getattr__ = lazy_getattr(__name__, _EXPORTS)

__all__ = ["CsvSource", "HttpSource", "JsonlSource", "NatsSource"]
