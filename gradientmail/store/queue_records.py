"""A work queue's records (``session/queue.py``): each unit's claim, and its done marker.

A claim is a mutable record (created by the first learner to take the unit, taken over by
compare-and-swap: ``store.cas``); a done marker is created once. A claim that does not parse or
verify, or names another queue or unit, reads as ``(None, token)``: it may be replaced.
"""

from __future__ import annotations

from gradientmail.errors import RecordExists
from gradientmail.records import QueueClaim, QueueDone, keys
from gradientmail.store.cas import CasRecords
from gradientmail.store.record_io import RecordIO

__all__ = ["QueueRecords"]


class QueueRecords:
    """Every work queue of one run (``RunStore.queues``)."""

    def __init__(self, io: RecordIO, cas: CasRecords) -> None:
        self._io = io
        self._cas = cas

    def units(self, queue: str) -> tuple[set[int], set[int]]:
        """The units of ``queue`` that have a claim, and those that are done (two LISTs)."""
        claimed: set[int] = set()
        done: set[int] = set()
        for part, into in (("claims", claimed), ("done", done)):
            for _, parsed in self._io.listed(keys.queue_prefix(queue, part)):
                if isinstance(parsed, keys.QueueKey) and parsed.queue == queue and parsed.part == part:
                    into.add(parsed.unit)
        return claimed, done

    def read_claim(self, queue: str, unit: int) -> tuple[QueueClaim | None, str] | None:
        """A unit's claim and its version token; ``(None, token)`` for one that does not parse or
        verify (it may be replaced); None when the unit has no claim."""
        found = self._cas.read(QueueClaim, keys.queue_claim(queue, unit))
        if found is None:
            return None
        claim = found.record
        return (claim, found.token) if claim is not None and claim.queue == queue and claim.unit == unit else (None, found.token)

    def create_claim(self, claim: QueueClaim) -> str:
        """Claim an unclaimed unit; ``RecordExists`` when another learner was first."""
        return self._cas.create(keys.queue_claim(claim.queue, claim.unit), claim)

    def swap_claim(self, claim: QueueClaim, expected_token: str) -> str:
        """Take a unit's claim over by compare-and-swap; ``VersionConflict`` when someone else did."""
        return self._cas.swap(keys.queue_claim(claim.queue, claim.unit), claim, expected_token)

    def create_done(self, done: QueueDone) -> bool:
        """Record that a unit was trained to its end; False when it was already (create-once)."""
        try:
            self._cas.create(keys.queue_done(done.queue, done.unit), done)
        except RecordExists:
            return False
        return True
