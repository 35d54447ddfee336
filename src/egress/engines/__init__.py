"""Storage engines behind the ``Engine`` protocol (``Log``, ``CheckpointStore``, ``Ownership``, lifecycle)."""

from typing import TYPE_CHECKING, Any

from egress.engines.protocols import (
    Checkpoint,
    CheckpointStore,
    CommittedInventory,
    Engine,
    EpochCommit,
    FencedError,
    KeyedState,
    Log,
    LogAppend,
    LogMessage,
    OutboxMessage,
    Ownership,
    SinkProgress,
)
from egress.engines.sqlite import SqliteEngine

if TYPE_CHECKING:
    from egress.engines.nats import NatsEngine


def __getattr__(name: str) -> Any:
    """``NatsEngine`` on first use: importing it imports nats-py, which embedded runs never need."""
    if name == "NatsEngine":
        from egress.engines.nats import NatsEngine

        return NatsEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "CommittedInventory",
    "Engine",
    "EpochCommit",
    "FencedError",
    "KeyedState",
    "Log",
    "LogAppend",
    "LogMessage",
    "NatsEngine",
    "OutboxMessage",
    "Ownership",
    "SinkProgress",
    "SqliteEngine",
]
