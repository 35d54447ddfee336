"""Storage engines behind the ``Engine`` protocol (``Log``, ``CheckpointStore``, ``Ownership``,
``Membership``, lifecycle)."""

from typing import TYPE_CHECKING, Any

from egress.engines.protocols import (
    ROLE_PREFIX,
    SOURCE_PREFIX,
    AppendsCallback,
    Checkpoint,
    CheckpointStore,
    ChunkAt,
    CommittedInventory,
    Engine,
    EngineUnavailableError,
    EpochCommit,
    FencedError,
    KeyedState,
    LeaseInfo,
    LineChunkLog,
    Log,
    LogAppend,
    LogChunk,
    LogMessage,
    LogRetention,
    MemberCallback,
    MemberInfo,
    MemberNotices,
    Membership,
    MessageBus,
    MissedAppends,
    OutboxChunk,
    OutboxMessage,
    OutboxReader,
    Ownership,
    SinkProgress,
    StateLocation,
    TraceContexts,
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
    "ROLE_PREFIX",
    "SOURCE_PREFIX",
    "AppendsCallback",
    "Checkpoint",
    "CheckpointStore",
    "ChunkAt",
    "CommittedInventory",
    "Engine",
    "EngineUnavailableError",
    "EpochCommit",
    "FencedError",
    "KeyedState",
    "LeaseInfo",
    "LineChunkLog",
    "Log",
    "LogAppend",
    "LogChunk",
    "LogMessage",
    "LogRetention",
    "MemberCallback",
    "MemberInfo",
    "MemberNotices",
    "Membership",
    "MessageBus",
    "MissedAppends",
    "NatsEngine",
    "OutboxChunk",
    "OutboxMessage",
    "OutboxReader",
    "Ownership",
    "SinkProgress",
    "SqliteEngine",
    "StateLocation",
    "TraceContexts",
]
