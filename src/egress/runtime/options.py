"""Tuning of a pipeline run (not part of the Spec: these are properties of the runner)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunOptions:
    """``epoch_max_messages``: input messages one epoch takes at most; ``epoch_period`` (seconds):
    how long a partition job woken by acknowledgements alone gathers them before it commits them
    (epochs are adaptive: input, a stop, a sink state to commit or room to read start the next epoch
    at once, ``egress.runtime.partition_job``); ``live_poll_period`` (seconds): how long a live
    source's batch waits for its first record before its reader looks again (a followed file's
    poll period; a new record of the http or nats source ends the wait at once);
    ``max_unacknowledged``: messages a sink instance may hold unacknowledged before its partition
    job stops reading input (bounds memory; upstream bounds it by epoch size instead);
    ``source_chunk``: records a source reader commits at once; ``until_drained``: stop once every
    source is exhausted and every message acknowledged (or blocked by a terminal failure);
    ``synchronous``: SQLite's ``synchronous`` setting; ``dynamic_spec_period`` (seconds): how
    often the DynamicSpec file is checked for changes; ``throttler_url``: ``http://host:port`` of a
    shared ``egress throttler serve`` (``None``: throttlers run in this process).

    A cluster worker also uses: ``lease_ttl`` (seconds a lease and a membership last without
    renewal), ``heartbeat_period`` (seconds between renewals; a quarter of the TTL), together the
    failover time of a dead worker's units (``lease_ttl + heartbeat_period`` plus one epoch);
    ``remote_poll_period`` (seconds): how often every job looks for input another worker appended,
    the backstop of the engine's append notifications (on a ``MissedAppends`` engine, NATS, only
    when it says an append was stored since); ``drained_check_period`` (seconds): how often
    the engine is asked whether the whole pipeline is drained. On NATS, ``replicas`` is the
    pipeline stream's replica count (1; 3 on a cluster).

    On SQLite, the log is trimmed every ``log_trim_period`` seconds (by the one worker running the
    first computation's partition 0 with ``--processes N``; and when the run or worker stops) of
    the messages every computation reading them has committed past, but for the last
    ``log_retention`` messages of each log partition, kept for replay (``egress.runtime.retention``)."""

    epoch_max_messages: int = 2048
    epoch_period: float = 0.05
    live_poll_period: float = 0.05
    max_unacknowledged: int = 8192
    source_chunk: int = 4096
    until_drained: bool = False
    synchronous: str = "FULL"
    dynamic_spec_period: float = 1.0
    throttler_url: str | None = None
    lease_ttl: float = 10.0
    heartbeat_period: float = 2.5
    remote_poll_period: float = 1.0
    drained_check_period: float = 0.5
    replicas: int = 1
    log_retention: int = 0
    log_trim_period: float = 1.0


@dataclass(frozen=True)
class EngineChoice:
    """What ``egress run --engine`` names: ``sqlite`` (``servers`` empty: the state directory) or
    NATS JetStream at ``servers`` (``nats://host:port`` each)."""

    servers: tuple[str, ...] = ()

    @property
    def is_nats(self) -> bool:
        return bool(self.servers)

    @property
    def url(self) -> str:
        return ",".join(self.servers) if self.servers else "sqlite"


def parse_engine(text: str) -> EngineChoice:
    """``sqlite`` or ``nats://HOST:PORT[,HOST:PORT...]`` (each further server may repeat ``nats://``).
    Raises ``ValueError`` saying what is accepted."""
    if text == "sqlite":
        return EngineChoice()
    if not text.startswith("nats://"):
        raise ValueError(f"{text!r}: use sqlite (the state directory, the default) or nats://HOST:PORT[,HOST:PORT...]")
    servers = []
    for part in text.removeprefix("nats://").split(","):
        address = part.strip().removeprefix("nats://")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{text!r}: {part!r} is not HOST:PORT (e.g. nats://127.0.0.1:4222,127.0.0.1:4223)")
        servers.append(f"nats://{address}")
    return EngineChoice(tuple(servers))
