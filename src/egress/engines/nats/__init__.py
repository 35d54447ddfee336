"""The NATS JetStream engine (scale-out): :class:`NatsEngine`. Importing this package imports
nats-py; ``egress.engines`` exports ``NatsEngine`` lazily, so embedded runs never load it.

:class:`NatsEngine` (``engine.py``) is one class per role on a shared connection
(``connection.py``): ``log.py`` (``Log``; ``log_index.py`` what it knows of the chunks),
``checkpoints.py`` and ``commits.py`` (``CheckpointStore``: loading, and the fenced atomic batch
with its redo and compaction; ``views.py`` what a committer knows of its consumer partition),
``ownership.py`` (``Ownership``), ``membership.py`` (``Membership``), ``meta.py`` (metadata and
inventory), ``appends.py`` (append notifications), ``retention.py`` (log trimming). The bucket's
subjects are ``subjects.py``, the payloads ``records.py``, the JetStream requests ``jetstream.py``.

nats-py imports aiohttp for its WebSocket transport (``ws://`` servers), which the engine does not
use (it connects to ``nats://`` URLs); aiohttp is 0.4–0.5 CPU-s of imports, paid by every worker at
every start. When nothing imported aiohttp yet, nats-py is imported here without it
(:func:`_import_nats_without_aiohttp`); a later ``import aiohttp`` (the http source, a receiver)
loads it as usual.
"""

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType


class _NoAiohttp(importlib.abc.MetaPathFinder):
    """Makes ``import aiohttp`` fail while nats-py is being imported (see the module docs)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "aiohttp" or fullname.startswith("aiohttp."):
            raise ModuleNotFoundError(f"not imported with nats-py: {fullname}", name=fullname)
        return None


def _import_nats_without_aiohttp() -> None:
    if "aiohttp" in sys.modules or "nats" in sys.modules:
        return
    finder = _NoAiohttp()
    sys.meta_path.insert(0, finder)
    try:
        import nats.aio.client  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


_import_nats_without_aiohttp()

from egress.engines.nats.engine import NatsEngine  # noqa: E402
from egress.engines.nats.errors import NatsEngineError, NatsUnavailableError  # noqa: E402

__all__ = ["NatsEngine", "NatsEngineError", "NatsUnavailableError"]
