"""Storage engines behind the ``Engine`` protocol (``Log``, ``CheckpointStore``, ``Ownership``, lifecycle)."""

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
    "OutboxMessage",
    "Ownership",
    "SinkProgress",
    "SqliteEngine",
]
