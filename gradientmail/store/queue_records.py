"""A work queue's records (``session/queue.py``): each unit's claim, and its done marker.

A claim is a mutable record (created by the first learner to take the unit, taken over by
compare-and-swap: ``store.cas``); a done marker is created once. Neither is believed by its
name: a claim that does not parse or verify, or names another queue or unit, reads as
``(None, token)`` and may be replaced; a unit is done only by a done marker that parses,
verifies and names its queue and unit (INV-24). A marker that does not is skipped, counted
(``invalid_done``, reported by ``audit``) and written over by the next learner to finish the unit.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from gradientmail.errors import KeyNotFound, RecordExists, VersionConflict
from gradientmail.records import QueueClaim, QueueDone, keys
from gradientmail.store.cas import CasRead, CasRecords
from gradientmail.store.record_io import RecordIO

__all__ = ["QueueRecords"]

log = logging.getLogger(__name__)

_SWAP_TRIES = 3
"""Tries at writing over an invalid done marker that keeps changing under us (each lost race
means another writer replaced it: a learner's valid marker ends the loop)."""


class QueueRecords:
    """Every work queue of one run (``RunStore.queues``)."""

    def __init__(self, io: RecordIO, cas: CasRecords) -> None:
        self._io = io
        self._cas = cas
        self._done: dict[str, dict[int, QueueDone]] = {}
        """queue → unit → its verified done marker (create-once, so read once)."""
        self._invalid: dict[str, dict[int, str]] = {}
        """queue → unit → why the done marker there was not believed, as of the last look."""

    def queue_names(self) -> list[str]:
        """The work queues with a record in the mailbox (one LIST of them all)."""
        return sorted({parsed.queue for _, parsed in self._io.listed(keys.QUEUES) if isinstance(parsed, keys.QueueKey)})

    def invalid_done(self, queue: str) -> dict[int, str]:
        """Unit → why its done marker is not believed, as of the last ``units`` of ``queue``."""
        return dict(self._invalid.get(queue, {}))

    def units(self, queue: str, *, below: int | None = None) -> tuple[set[int], set[int]]:
        """The units of ``queue`` (those ``< below`` when given) that have a claim, and those
        that are done: two LISTs, then a GET of each done marker not yet verified."""
        named: dict[str, set[int]] = {"claims": set(), "done": set()}
        for part, into in named.items():
            for _, parsed in self._io.listed(keys.queue_prefix(queue, part)):
                if not isinstance(parsed, keys.QueueKey) or parsed.queue != queue or parsed.part != part:
                    continue
                if below is None or parsed.unit < below:
                    into.add(parsed.unit)
        return named["claims"], self._verified_done(queue, named["done"])

    def _verified_done(self, queue: str, listed: set[int]) -> set[int]:
        verified = self._done.setdefault(queue, {})
        invalid = self._invalid.setdefault(queue, {})
        for unit in sorted(listed - verified.keys()):
            found = self._read_done(queue, unit)
            if found is not None and found.record is not None:
                verified[unit] = found.record
                invalid.pop(unit, None)
            elif found is not None:
                if unit not in invalid:
                    log.warning("queue %s: unit %d's done marker is not believed (%s); it stays open", queue, unit, found.problem)
                invalid[unit] = found.problem
        for unit in set(invalid) - listed:
            del invalid[unit]
        return set(verified)  # a verified marker deleted since is still done: create-once

    def _read_done(self, queue: str, unit: int) -> CasRead[QueueDone] | None:
        """A unit's done marker as found (None: absent); its ``record`` is None, with the
        ``problem``, unless it is a valid marker of that unit."""
        found = self._cas.read(QueueDone, keys.queue_done(queue, unit))
        if found is None or found.record is None:
            return found if found is None or found.problem else replace(found, problem="does not parse")
        if found.record.queue != queue or found.record.unit != unit:
            return replace(found, record=None, problem=f"names unit {found.record.unit} of queue {found.record.queue!r}")
        return found

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
        """Record that a unit was trained to its end; False when a valid marker was there already
        (create-once). An invalid marker there is written over by compare-and-swap."""
        location = keys.queue_done(done.queue, done.unit)
        for _ in range(_SWAP_TRIES):
            try:
                self._cas.create(location, done)
                return self._remember(done)
            except RecordExists:
                pass
            found = self._read_done(done.queue, done.unit)
            if found is None or not found.token:  # deleted between our create and our read: create again
                continue
            if found.record is not None:
                self._remember(found.record)
                return False
            try:
                self._cas.swap(location, done, found.token)
            except (VersionConflict, KeyNotFound):
                continue
            log.warning("queue %s: wrote over unit %d's invalid done marker (%s)", done.queue, done.unit, found.problem)
            return self._remember(done)
        return False

    def _remember(self, done: QueueDone) -> bool:
        """Note a valid done marker (ours, or one found there); True, for ``create_done``."""
        self._done.setdefault(done.queue, {})[done.unit] = done
        self._invalid.get(done.queue, {}).pop(done.unit, None)
        return True
