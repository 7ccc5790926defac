"""Leases: liveness claims in the mailbox, judged on the observer's own monotonic clock.

Machines' wall clocks are never compared. A holder renews by writing a new ``sequence``;
an observer remembers when it first saw each version token of a lease and calls the lease
expired once that token has stayed unchanged for ``ttl_s`` seconds of *its* time (or the
holder released it). A new observer therefore waits a full TTL before calling a lease dead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gradientmail.records import Lease, keys
from gradientmail.store.run_store import RunStore

__all__ = ["Clock", "LeaseObserver", "LearnerLease", "live_learners"]

Clock = Callable[[], float]


@dataclass
class _Sighting:
    token: str
    first_seen: float


class LeaseObserver:
    """Remembers when each lease last changed, on this node's clock."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._sightings: dict[str, _Sighting] = {}

    def expired(self, key: str, lease: Lease, token: str) -> bool:
        now = self._clock()
        sighting = self._sightings.get(key)
        if sighting is None or sighting.token != token:
            self._sightings[key] = _Sighting(token, now)
            return lease.released
        return lease.released or now - sighting.first_seen >= lease.ttl_s

    def unchanged_for(self, key: str) -> float:
        sighting = self._sightings.get(key)
        return 0.0 if sighting is None else self._clock() - sighting.first_seen


def live_learners(store: RunStore, observer: LeaseObserver) -> dict[str, Lease]:
    """Learners whose lease has not expired in ``observer``'s judgement."""
    live: dict[str, Lease] = {}
    for key in store.learner_lease_keys():
        found = store.read_lease(key)
        if found is None:
            continue
        lease, token = found
        if lease.kind == "learner" and not observer.expired(key, lease, token):
            live[lease.holder] = lease
    return live


class LearnerLease:
    """A learner's own lease: written with plain puts (its id is its own, a restart takes it over)."""

    def __init__(self, store: RunStore, learner: str, ttl_s: float) -> None:
        self._store = store
        self._key = keys.learner_lease(learner)
        self._learner = learner
        self._ttl_s = ttl_s
        self._sequence = 0

    def renew(self, info: dict[str, object]) -> None:
        self._write(released=False, info=info)

    def release(self) -> None:
        self._write(released=True, info={})

    def _write(self, *, released: bool, info: dict[str, object]) -> None:
        self._sequence += 1
        lease = Lease(
            kind="learner", holder=self._learner, sequence=self._sequence, ttl_s=self._ttl_s, released=released, info=info
        )
        self._store.put_lease(self._key, lease)
