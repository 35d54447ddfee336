"""Observability: the metrics registry and the status tree of a running pipeline."""

from egress.observe.metrics import Metrics
from egress.observe.status import StatusEntry, StatusTree

__all__ = ["Metrics", "StatusEntry", "StatusTree"]
