"""The NATS JetStream engine (scale-out): :class:`NatsEngine`. Importing this package imports
nats-py; ``egress.engines`` exports ``NatsEngine`` lazily, so embedded runs never load it."""

from egress.engines.nats.engine import NatsEngine
from egress.engines.nats.errors import NatsEngineError, NatsUnavailableError

__all__ = ["NatsEngine", "NatsEngineError", "NatsUnavailableError"]
