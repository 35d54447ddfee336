"""The embedded engine: its roles on one SQLite connection, put together."""

from __future__ import annotations

from pathlib import Path

from egress.clock import Clock
from egress.engines.sqlite.checkpoints import SqliteCheckpoints
from egress.engines.sqlite.commits import SqliteCommits
from egress.engines.sqlite.membership import SqliteMembership
from egress.engines.sqlite.meta import SqliteMeta
from egress.engines.sqlite.retention import SqliteRetention


class SqliteEngine(SqliteCommits, SqliteCheckpoints, SqliteMembership, SqliteMeta, SqliteRetention):
    """``Log``, ``CheckpointStore``, ``Ownership`` and ``Membership`` on one SQLite file in ``state_dir``.

    ``open()`` creates the directory and schema, takes an exclusive lock on the directory (a
    second process gets :class:`StateDirectoryError` naming the first's pid) and checks that the
    directory belongs to ``pipeline``. ``synchronous`` is SQLite's setting (``FULL`` survives a
    power loss; ``NORMAL`` only a process crash). ``clock`` (default :class:`RealClock`) measures
    lease and member TTLs (its ``now()``, wall-clock seconds).

    ``shared=True`` is for one of several processes on one state directory (``egress run
    --processes N``: the parent holds the directory's lock, each child opens a shared engine): it
    takes no lock, reads each log partition's end offset inside the transaction that appends to it
    (SQLite lets one write transaction run at a time, waiting up to :data:`SHARED_BUSY_TIMEOUT`
    seconds for another's), and calls :meth:`on_appends` callbacks for the other processes' log
    appends.
    """

    def __init__(self, state_dir: str | Path, pipeline: str, *, synchronous: str = "FULL",
                 clock: Clock | None = None, shared: bool = False) -> None:
        super().__init__(state_dir, pipeline, synchronous=synchronous, clock=clock, shared=shared)
