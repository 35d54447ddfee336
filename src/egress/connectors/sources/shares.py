"""How the readers of a followed glob (``readers: N``) share its files: reader 0 deals them.

A file belongs to one reader for as long as it exists, decided once, the same for every reader:

* **Reader 0 deals.** At each scan it gives every matched file that no reader has yet to the
  reader with the fewest of the files now matched, then the fewest of their bytes, then the
  lowest index (:func:`least_loaded`), in the glob's sorted path order, and commits the deals in
  its source state with its next batch (``"dealt"``: ``[inode, reader]`` pairs in the order
  dealt). A deal is never changed: a restarted dealer resumes from its committed deals. It keeps
  the deal of every file it still matches and of the last :data:`DEALT_KEPT` it no longer does
  (a file renamed out of the glob and back keeps its reader).
* **Readers 1 .. N-1 wait for the deal.** Each takes a file it does not follow yet only when
  reader 0's *committed* state gives it that file (the runtime hands every reader a function that
  loads reader ``k``'s committed source state, :meth:`FileShares.deal_from`): it loads it again
  when a scan met a file not dealt yet, at most every :data:`FETCH_PERIOD` seconds. So two readers
  never take one file, and a file not dealt yet waits for reader 0 (which runs wherever its lease
  is).
* **The dealer starts from what the others follow.** Before its first deal, reader 0 loads every
  other reader's committed state and counts each file it follows as dealt to it, so the files of
  a state committed before the deals existed (when readers chose by a hash of the inode) stay
  where they are.

A file is known by its inode, not its name, so a file renamed within the glob keeps its reader.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

DEALT_KEPT = 1024
"""Deals of files the glob no longer matches that the dealer keeps (the oldest dropped first)."""
FETCH_PERIOD = 0.25
"""Seconds between two loads of the dealer's committed state by a reader waiting for a deal."""

ReaderState = Callable[[int], Awaitable[bytes]]
"""``reader_state(k)``: reader ``k``'s committed source state (``b""`` before its first commit)."""


def least_loaded(loads: Sequence[tuple[int, int]]) -> int:
    """The reader to deal a new file to: ``loads[k]`` is reader ``k``'s ``(files, bytes)`` among
    the files matched now; the fewest files, then the fewest bytes, then the lowest index."""
    return min(range(len(loads)), key=lambda index: (loads[index][0], loads[index][1], index))


class FileShares:
    """Reader ``index`` of ``count``'s view of the deals (``count`` 1: every file is its own)."""

    def __init__(self, index: int = 0, count: int = 1) -> None:
        self.index, self.count = index, count
        self.dealt: dict[int, int] = {}  # inode → reader: the dealer's own, or the deals last loaded
        self.undealt = False  # the last scan met a file no deal gives to anyone yet (readers 1 ..)
        self.reader_state: ReaderState | None = None
        self.loaded_at: float | None = None  # readers 1 ..: when the dealer's state was loaded last
        self.seeded = False  # the dealer: the other readers' files counted
        self._loads: list[list[int]] = []

    @property
    def dealer(self) -> bool:
        return self.index == 0 and self.count > 1

    def deal_from(self, reader_state: ReaderState) -> None:
        """``reader_state(k)`` loads reader ``k``'s committed source state."""
        self.reader_state = reader_state

    async def refresh(self, now: float) -> None:
        """Before a scan: the dealer counts the other readers' files once; another reader loads the
        dealer's deals when it has none yet, or when a file waited for its deal for
        :data:`FETCH_PERIOD`."""
        if self.reader_state is None or self.count == 1:
            return
        if self.dealer:
            if not self.seeded:
                for reader in range(1, self.count):
                    state = await self.reader_state(reader)
                    for entry in orjson.loads(state).get("files", []) if state else []:
                        self.dealt.setdefault(int(entry["inode"]), reader)
                self.seeded = True
            return
        if self.loaded_at is None or (self.undealt and now - self.loaded_at >= FETCH_PERIOD):
            self.learn(await self.reader_state(0), now)

    # -- state -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What this reader commits in its source state (nothing with one reader)."""
        if self.dealer:
            return {"dealt": [[inode, reader] for inode, reader in self.dealt.items()]}
        return {}

    def restore(self, document: Mapping[str, Any], followed: Sequence[int]) -> None:
        """The dealer's committed ``document``; ``followed``: the inodes of the files it follows."""
        if self.dealer:
            self.dealt = {int(inode): int(reader) for inode, reader in document.get("dealt", [])}
            for inode in followed:
                self.dealt.setdefault(inode, 0)

    def learn(self, dealer_state: bytes, now: float) -> None:
        """Reader 0's committed source state, just loaded (``b""``: it committed none yet)."""
        self.loaded_at = now
        if dealer_state:
            self.dealt = {int(inode): int(reader) for inode, reader in orjson.loads(dealer_state).get("dealt", [])}

    # -- a scan ------------------------------------------------------------------------------

    def begin(self, matched: Mapping[int, int]) -> None:
        """A scan starts; ``matched``: inode → size of every file the glob matches now."""
        self.undealt = False
        if not self.dealer:
            return
        self._loads = [[0, 0] for _ in range(self.count)]
        for inode, size in matched.items():
            reader = self.dealt.get(inode)
            if reader is not None and reader < self.count:
                self._loads[reader][0] += 1
                self._loads[reader][1] += size
        unmatched = [inode for inode in self.dealt if inode not in matched]
        for inode in unmatched[:max(0, len(unmatched) - DEALT_KEPT)]:
            del self.dealt[inode]

    def mine(self, inode: int, size: int) -> bool:
        """Whether this reader takes the new file ``inode`` (of ``size`` bytes) that it does not
        follow: its deal (made now when this is the dealer; one reader takes every file)."""
        if self.count == 1:
            return True
        reader = self.dealt.get(inode)
        if reader is None and self.dealer:
            reader = least_loaded([(files, size_) for files, size_ in self._loads])
            self.dealt[inode] = reader
            self._loads[reader][0] += 1
            self._loads[reader][1] += size
        if reader is None:
            self.undealt = True
            return False
        return reader == self.index
