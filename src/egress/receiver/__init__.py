"""A local HTTP endpoint that records, counts and injects faults (``egress receiver``)."""

from egress.receiver.app import Receiver, ReceiverConfig, ReceiverStats, serve

__all__ = ["Receiver", "ReceiverConfig", "ReceiverStats", "serve"]
