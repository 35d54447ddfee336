"""The NATS JetStream engine (scale-out): :class:`NatsEngine`. Importing this package imports
nats-py; ``egress.engines`` exports ``NatsEngine`` lazily, so embedded runs never load it.

:class:`NatsEngine` (``engine.py``) is one class per role on a shared connection
(``connection.py``): ``log.py`` (``Log``; ``log_index.py`` what it knows of the chunks),
``checkpoints.py`` and ``commits.py`` (``CheckpointStore``: loading, and the fenced atomic batch
with its redo and compaction; ``views.py`` what a committer knows of its consumer partition),
``ownership.py`` (``Ownership``), ``membership.py`` (``Membership``), ``meta.py`` (metadata and
inventory), ``appends.py`` (append notifications), ``retention.py`` (log trimming). The bucket's
subjects are ``subjects.py``, the payloads ``records.py``, the JetStream requests ``jetstream.py``.
"""

from egress.engines.nats.engine import NatsEngine
from egress.engines.nats.errors import NatsEngineError, NatsUnavailableError

__all__ = ["NatsEngine", "NatsEngineError", "NatsUnavailableError"]
