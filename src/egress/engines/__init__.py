"""Storage engines behind the ``Log``, ``CheckpointStore`` and ``Ownership`` protocols."""

from egress.engines.protocols import (
    Checkpoint,
    CheckpointStore,
    CommittedInventory,
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
