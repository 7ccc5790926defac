"""Leases: liveness claims in the mailbox, judged on the observer's own monotonic clock.

Machines' wall clocks are never compared. A holder renews by writing a new ``sequence``;
an observer remembers when it first saw each version token of a lease and calls the lease
expired once that token has stayed unchanged for the run's TTL (the manifest's, never the
TTL a lease claims for itself) on *its* clock, or the holder released it. A new observer
therefore waits a full TTL before calling a lease dead. A lease that does not parse or does
not verify under the run key is expired at once: nobody honest wrote it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gradientmail.records import Lease, keys
from gradientmail.store.run_store import LeaseRead, RunStore

__all__ = ["Clock", "LeaseObserver", "LearnerLease", "live_learners"]

Clock = Callable[[], float]


@dataclass
class _Sighting:
    token: str
    first_seen: float


class LeaseObserver:
    """Remembers when each lease last changed, on this node's clock."""

    def __init__(self, ttl_s: float, clock: Clock = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._sightings: dict[str, _Sighting] = {}

    def expired(self, key: str, found: LeaseRead) -> bool:
        """Whether the lease at ``key`` is dead: released, unreadable, or unchanged for a TTL."""
        if found.lease is None:
            return True
        now = self._clock()
        sighting = self._sightings.get(key)
        if sighting is None or sighting.token != found.token:
            self._sightings[key] = _Sighting(found.token, now)
            return found.lease.released
        return found.lease.released or now - sighting.first_seen >= self.ttl_s

    def unchanged_for(self, key: str) -> float:
        sighting = self._sightings.get(key)
        return 0.0 if sighting is None else self._clock() - sighting.first_seen

    def age(self, key: str) -> float | None:
        """Seconds since the lease at ``key`` was last seen to change; None if never seen (read-only)."""
        sighting = self._sightings.get(key)
        return None if sighting is None else self._clock() - sighting.first_seen


def live_learners(store: RunStore, observer: LeaseObserver) -> dict[str, Lease]:
    """Learners whose lease has not expired in ``observer``'s judgement."""
    live: dict[str, Lease] = {}
    for key in store.learner_lease_keys():
        found = store.read_lease(key, need_token=False)
        if found is None or found.lease is None:
            continue
        lease = found.lease
        if lease.kind == "learner" and key == keys.learner_lease(lease.holder) and not observer.expired(key, found):
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
