"""Start-time fair queueing (SFQ) over quota classes: pure, no time, no I/O.

Source: the contract's scheduler (Goyal, Vin and Cheng 1996) standing in for upstream's virtual-time
weighted fair queue in the Flow distributed throttler. Per class a finish tag ``F_i``; a global
virtual time ``v``. A class that becomes backlogged starts at ``S_i = max(v, F_i)`` (an idle class
banks nothing); the backlogged class with the smallest ``(S_i, class id)`` is served; serving ``c``
units sets ``v = S_i`` and ``F_i = S_i + c / w_i``. Weights are normalised by their sum, so scaling
every weight by one factor leaves the order of selection unchanged.

Fairness (Theorem 1 of the paper): over any interval in which classes ``i`` and ``j`` are both
backlogged, ``|W_i/w_i - W_j/w_j| <= m/w_i + m/w_j`` for chunks of at most ``m`` units.
"""

from __future__ import annotations

from collections.abc import Mapping


class ClassScheduler:
    """Chooses which backlogged class gets the next chunk; ``weights`` maps class id → weight > 0."""

    def __init__(self, weights: Mapping[str, float]) -> None:
        self.virtual_time = 0.0
        self._finish: dict[str, float] = {}
        self._start: dict[str, float] = {}  # backlogged classes only
        self._share: dict[str, float] = {}
        self.set_weights(weights)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Replace the weights (raises ``ValueError`` for a weight <= 0); charges already made stay.

        Classes missing from ``weights`` are forgotten (callers keep retired classes in until they drain).
        """
        if any(w <= 0 for w in weights.values()):
            raise ValueError(f"class weights must be positive, got {dict(weights)}")
        total = sum(weights.values())
        self._share = {class_id: weight / total for class_id, weight in weights.items()}
        for gone in [c for c in {*self._finish, *self._start} if c not in self._share]:
            self._finish.pop(gone, None)
            self._start.pop(gone, None)

    def share(self, class_id: str) -> float:
        """The normalised weight ``w_i / Σw`` of a class."""
        return self._share[class_id]

    def is_backlogged(self, class_id: str) -> bool:
        return class_id in self._start

    def activate(self, class_id: str) -> None:
        """The class has work now: its head gets start tag ``max(v, F_i)``. No-op if already backlogged."""
        if class_id not in self._share:
            raise KeyError(f'unknown quota class "{class_id}"')
        if class_id not in self._start:
            self._start[class_id] = max(self.virtual_time, self._finish.get(class_id, 0.0))

    def deactivate(self, class_id: str) -> None:
        """The class has no more work; it keeps its finish tag but no start tag (and banks nothing)."""
        self._start.pop(class_id, None)

    def select(self) -> str | None:
        """The backlogged class with the smallest ``(start tag, class id)``, or ``None``."""
        best: tuple[float, str] | None = None
        for class_id, start in self._start.items():
            if best is None or start < best[0] or (start == best[0] and class_id < best[1]):
                best = (start, class_id)
        return None if best is None else best[1]

    def charge(self, class_id: str, amount: float) -> float:
        """Serve ``amount`` units to a backlogged class; returns the virtual charge ``amount / share``."""
        start = self._start[class_id]
        cost = amount / self._share[class_id]
        self.virtual_time = max(self.virtual_time, start)
        self._finish[class_id] = start + cost
        self._start[class_id] = start + cost
        return cost

    def rollback(self, class_id: str, cost: float) -> None:
        """Undo virtual charges (``cost`` as returned by :meth:`charge`, whatever the weight is now)."""
        if class_id not in self._finish:
            return
        self._finish[class_id] -= cost
        if class_id in self._start:
            self._start[class_id] = max(self.virtual_time, self._start[class_id] - cost)
