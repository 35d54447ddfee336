"""Parts shared by the live sources (``nats``, ``http``, followed files)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from egress.clock import Clock
from egress.connectors.base import SourceRecord
from egress.errors import SecretUnavailable, SpecError
from egress.secret_references import read_secret


@runtime_checkable
class UsesClock(Protocol):
    """A source whose waits and timestamps come from the run's clock (``egress.clock``; a
    ``VirtualClock`` in tests): its reader calls :meth:`use_clock` before anything else."""

    def use_clock(self, clock: Clock) -> None:
        """Wait and stamp with ``clock`` from now on (until then: the real clock)."""
        ...


@runtime_checkable
class HoldsBack(Protocol):
    """A live source that refuses its producers while the pipeline downstream holds back (the
    ``http`` source's ``429``): its reader tells it the backlog before every batch it takes."""

    def hold_back(self, backlog: int) -> None:
        """``backlog``: the source's records committed into the log and not yet delivered by the
        computations reading its stream (``egress.runtime.source_reader.downstream_backlog``)."""
        ...


@runtime_checkable
class TakesAhead(Protocol):
    """A live source whose next batch may be taken while the batch before is being committed: its
    ``committed()`` does nothing (its committed position and state are the acknowledgement), so
    its reader overlaps the commit's round trip with reading and keying the next batch; the commits
    themselves stay one after the other, in order (``takes_ahead`` True; the ``http`` source, which
    answers the batch taken last once it is committed, does not)."""

    takes_ahead: bool


class HeldFailure:
    """A live source's failure met after some records of a batch (a bad record under
    ``on_bad_record: fail``): :meth:`taken_before` returns those records, so the reader commits
    them with the position before the failure, and the next ``take`` raises it
    (:meth:`raise_held`, called first)."""

    _held: Exception | None = None

    def taken_before(self, records: list[SourceRecord], failure: Exception) -> list[SourceRecord]:
        """``records`` (those before ``failure``), ``failure`` held for the next take; raises it now
        when there are none."""
        if not records:
            raise failure
        self._held = failure
        return records

    def raise_held(self) -> None:
        """Raise the failure :meth:`taken_before` held, if any."""
        failure, self._held = self._held, None
        if failure is not None:
            raise failure


class CountedPosition:
    """``position`` (the next record's, kept in ``_position``), an empty ``source_state`` and a
    ``committed()`` with nothing to do: the :class:`~egress.connectors.base.LiveSource` members of a
    source whose committed position is its whole state."""

    _position: int = 0

    @property
    def position(self) -> int:
        return self._position

    @property
    def source_state(self) -> bytes:
        return b""

    def committed(self) -> None:
        """Nothing to do: the committed position is the acknowledgement."""


def referenced_file_errors(base_dir: Path, field: str, value: str | None) -> list[SpecError]:
    """A file a parameter references (a credential, relative to the Spec's folder) must exist, be
    readable UTF-8 text and hold something: ``egress validate`` says so as ``egress run`` would at the
    source's start. The message names the file, never what it holds."""
    if value is None:
        return []
    path, fix = base_dir / value, "write the secret there or name another file"
    if not path.exists():
        return [SpecError(f"file not found: {path} (a relative path starts at the Spec's folder)",
                          path=f"parameters/{field}")]
    try:
        text = read_secret(file=path)
    except SecretUnavailable as error:
        return [SpecError(f"{error}: {fix}", path=f"parameters/{field}")]
    if text is None or not text.strip():
        return [SpecError(f"file {path} is empty: {fix}", path=f"parameters/{field}")]
    return []
