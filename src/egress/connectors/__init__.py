"""Sources and sinks, registered by class name (importing this package registers them all)."""

from egress.connectors import sinks, sources
from egress.connectors.base import SINKS, SOURCES, Registry, SinkContext, SourceRecord

__all__ = ["SINKS", "SOURCES", "Registry", "SinkContext", "SourceRecord", "sinks", "sources"]
