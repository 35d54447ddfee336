"""The errors of the NATS engine."""

from __future__ import annotations

from egress.errors import EgressError, EngineUnavailableError


class NatsEngineError(EgressError):
    """The NATS server cannot be reached or used, or refused an operation. The message names the
    server URL (and the bucket or consumer partition concerned) and the fix."""


class NatsUnavailableError(EngineUnavailableError):
    """The server gave no usable answer for longer than the engine's ``outage_timeout`` (connection
    lost and not back, JetStream not ready, no stream leader). Retryable: what was committed stays
    committed and an operation that raised this either took effect whole or not at all; a job
    that gets it restarts from its committed checkpoint (``load_checkpoint``) once the server is back.

    Not a :class:`NatsEngineError`: the runtime catches :class:`~egress.errors.EngineUnavailableError`
    (any engine's outage) and the engine's own code names both where it handles either."""


class JetStreamRequestError(NatsEngineError):
    """The server refused a request; ``code`` is JetStream's ``err_code`` (for a direct get, the
    status it answered, e.g. 503; 0 when it gave none)."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(f"{description} (err_code {code})")
        self.code = code
        self.description = description
