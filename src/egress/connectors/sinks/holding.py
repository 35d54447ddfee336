"""The Sink protocol's ``hold``, ``resume`` and ``in_flight``, written once for the async HTTP sink and
the batching sinks (``batches.BatchedSink``): a sink that starts deliveries from its waiting queue
in ``_start_waiting`` (which starts none while ``_held``) and counts those started and not finished
in ``_running``."""

from __future__ import annotations


class HeldStarts:
    """Mixed into a sink: see the module docs. The sink sets ``_held = False`` and ``_running = 0``."""

    _held: bool
    _running: int

    def _start_waiting(self) -> None:
        raise NotImplementedError

    def hold(self) -> None:
        """Start no delivery until :meth:`resume` (those running go on, retries included)."""
        self._held = True

    def resume(self) -> None:
        """Start the deliveries held back by :meth:`hold`."""
        if self._held:
            self._held = False
            self._start_waiting()

    @property
    def in_flight(self) -> int:
        """Deliveries (messages, or batches) started and not finished (acknowledged or failed for good)."""
        return self._running


__all__ = ["HeldStarts"]
