"""A state directory read without taking it over (read-only, safe while a run holds it), and its
metadata checks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from egress.engines.protocols import OutboxMessage, StateLocation
from egress.engines.sqlite.batches import outbox_entries
from egress.engines.sqlite.schema import DATABASE_NAME, READABLE_SCHEMA_VERSIONS, table_names
from egress.errors import SpecMismatchError, StateDirectoryError


def read_state(state_dir: str | Path) -> dict[str, list[tuple[str, str, bytes, bytes]]]:
    """Read a state directory without taking it over (read-only, safe while a run holds it).

    Returns ``{"internal": [(consumer, state name, encoded key, value bytes)], "external":
    [("", table, encoded key, row bytes)]}`` sorted by name and key. Raises
    :class:`StateDirectoryError` when ``state_dir`` holds no egress state.
    """
    db = connect_read_only(state_dir)
    if db is None:
        raise StateDirectoryError(f"{state_dir}: no egress state here (no {DATABASE_NAME})")
    try:
        tables = table_names(db)
        internal = [(str(c), str(n), bytes(k), bytes(v)) for c, n, k, v in db.execute(
            "SELECT consumer, name, key, value FROM state ORDER BY consumer, name, key")] if "state" in tables else []
        external = [("", str(n), bytes(k), bytes(v)) for n, k, v in db.execute(
            "SELECT name, key, row FROM external_state ORDER BY name, key")] if "external_state" in tables else []
    finally:
        db.close()
    return {"internal": internal, "external": external}


def read_outbox(state_dir: str | Path) -> list[tuple[str, int, OutboxMessage]]:
    """Every stored outbox message of a state directory as ``(consumer, partition, message)``, sorted
    by consumer, partition and seq, read without taking it over (read-only, safe while a run holds it
    or after it was killed). Messages a commit trimmed but whose batch is still stored are left out.
    Raises :class:`StateDirectoryError` when ``state_dir`` holds no egress state."""
    db = connect_read_only(state_dir)
    if db is None:
        raise StateDirectoryError(f"{state_dir}: no egress state here (no {DATABASE_NAME})")
    try:
        trimmed = {(str(c), int(p)): int(seq) for c, p, seq in db.execute(
            "SELECT consumer, partition, seq FROM outbox_acknowledged")}
        batches = db.execute("SELECT consumer, partition, stream, first_seq, messages FROM outbox_batches").fetchall()
        found = [(str(c), int(p), OutboxMessage(seq, str(stream), *entry))
                 for c, p, stream, first, blob in batches
                 for seq, *entry in outbox_entries(db, first, blob) if seq > trimmed.get((str(c), int(p)), 0)]
    finally:
        db.close()
    return sorted(found, key=lambda item: (item[0], item[1], item[2].seq))


def state_directory(state_dir: str | Path) -> StateLocation:
    """The :class:`StateLocation` of a state directory: a Spec starts over in another one."""
    return StateLocation(f"state directory {state_dir}", "give this Spec another --state-dir")


def check_metadata(meta: dict[str, str], state_dir: str | Path, pipeline: str) -> None:
    """Raise :class:`SpecMismatchError` (without the Spec file) unless the directory's metadata
    ``meta`` says it belongs to ``pipeline``, :class:`StateDirectoryError` unless it has a layout
    version this egress reads (:data:`READABLE_SCHEMA_VERSIONS`)."""
    if meta.get("pipeline") != pipeline:
        location = state_directory(state_dir)
        raise SpecMismatchError(f"{location.name} belongs to pipeline {meta.get('pipeline')!r}, not "
                                f"{pipeline!r}: {location.start_over}", path="pipeline", state_dir=str(state_dir))
    if meta.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        raise StateDirectoryError(
            f"{state_dir}: state layout version {meta.get('schema_version')} is not one this egress "
            f"reads ({', '.join(READABLE_SCHEMA_VERSIONS)}); use the egress version that wrote it"
        )


def read_metadata(state_dir: str | Path) -> dict[str, str] | None:
    """The metadata of a state directory, read without taking it over (read-only, safe while a run
    holds it); ``None`` when ``state_dir`` holds no egress state yet."""
    db = connect_read_only(state_dir)
    if db is None:
        return None
    try:
        if "meta" not in table_names(db):
            return {}
        return {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta")}
    finally:
        db.close()


def connect_read_only(state_dir: str | Path) -> sqlite3.Connection | None:
    """A read-only connection to the directory's database (``None`` when it has none)."""
    path = Path(state_dir) / DATABASE_NAME
    if not path.exists():
        return None
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)

