"""What this node's own learner published, handed to its syncer in memory.

A node that trains and holds the election would otherwise read back (GET, digest, decode) the
contribution its own learner just wrote. The learner's thread hands it over instead
(``SyncerRuntime.contribution_published``); the round that examines it takes it (its record
is still checked as any other's, ``rounds.fetch_contribution``). Bounded: at most
``HANDED_KEPT`` are held, and a commit drops the ones it made stale.
"""

from __future__ import annotations

import threading

from gradientmail.syncer.rounds import Handed

__all__ = ["HANDED_KEPT", "HandedContributions"]

HANDED_KEPT = 64
"""Contributions of this node's learner kept in memory for its syncer at most (each is taken by
the round that examines it, or dropped when a commit makes it stale)."""


class HandedContributions:
    """Contribution record key → what this node's learner published; safe across threads."""

    def __init__(self, limit: int = HANDED_KEPT) -> None:
        self.lock = threading.Lock()
        """Held by whoever touches this, and by the runtime while it marks a fragment notified."""
        self._limit = limit
        self._items: dict[str, Handed] = {}

    def offer(self, handed: Handed) -> None:
        """Keep ``handed`` unless ``limit`` are held already (the syncer then reads it back). Call with ``lock`` held."""
        if len(self._items) < self._limit:
            self._items[handed.key.record] = handed

    def take(self, record: str) -> Handed | None:
        with self.lock:
            return self._items.pop(record, None)

    def committed(self, fragment: int, version: int) -> None:
        """``version`` of ``fragment`` was committed: what its round did not take is stale now."""
        with self.lock:
            self._items = {k: h for k, h in self._items.items() if h.key.fragment != fragment or h.key.base_version >= version}

    def clear(self) -> None:
        """Not closing rounds: none will be taken."""
        with self.lock:
            self._items.clear()
