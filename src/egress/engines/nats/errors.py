"""The errors of the NATS engine."""

from __future__ import annotations

from egress.errors import EgressError


class NatsEngineError(EgressError):
    """The NATS server cannot be reached or used, or refused an operation. The message names the
    server URL (and the bucket or consumer partition concerned) and the fix."""


class JetStreamRequestError(NatsEngineError):
    """The server refused a request; ``code`` is JetStream's ``err_code`` (0 when it gave none)."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(f"{description} (err_code {code})")
        self.code = code
        self.description = description
