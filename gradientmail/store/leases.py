"""Leases: liveness claims in the mailbox, judged on the observer's own monotonic clock.

Machines' wall clocks are never compared. A holder renews by writing a new ``sequence``;
an observer remembers when it first saw each version token of a lease and calls the lease
expired once that token has stayed unchanged for the run's TTL (the manifest's, never the
TTL a lease claims for itself) on *its* clock, or the holder released it. A new observer
therefore waits a full TTL before calling a lease dead. A lease that does not parse or does
not verify under the run key is expired at once: nobody honest wrote it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from gradientmail.errors import DuplicateLearner, KeyNotFound, VersionConflict
from gradientmail.records import Lease, check_learner_id, keys
from gradientmail.store.run_store import LeaseRead, RunStore

log = logging.getLogger(__name__)

__all__ = ["TRAINING", "Clock", "LeaseName", "LeaseObserver", "LearnerLease", "live_learners", "others_training", "trains"]

Clock = Callable[[], float]


@dataclass(frozen=True)
class LeaseName:
    """Which lease an observer judges, named by what it is instead of by its key: the run's syncer
    lease (:attr:`SYNCER`) or one learner's own (:meth:`of_learner`). The roles name leases this
    way; only the store turns a name into a key."""

    learner: str | None = None
    """The learner whose own lease it is; None for the syncer lease."""

    SYNCER: ClassVar[LeaseName]

    @classmethod
    def of_learner(cls, learner: str) -> LeaseName:
        """A learner's own lease; ``InvalidKey`` for an id that is not a valid learner id."""
        return cls(check_learner_id(learner))

    @property
    def key(self) -> str:
        """The lease's key in the mailbox (for the store layer)."""
        return keys.SYNCER_LEASE if self.learner is None else keys.learner_lease(self.learner)


LeaseName.SYNCER = LeaseName()


def _slot(name: LeaseName | str) -> str:
    """Where the observer files a lease: its key. A plain ``str`` is taken as the key itself, the form
    callers used before :class:`LeaseName`; both forms of one lease share one sighting."""
    return name if isinstance(name, str) else name.key


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

    def expired(self, name: LeaseName | str, found: LeaseRead) -> bool:
        """Whether the lease ``name`` is dead: released, unreadable, or unchanged for a TTL."""
        if found.lease is None:
            return True
        slot = _slot(name)
        now = self._clock()
        sighting = self._sightings.get(slot)
        if sighting is None or sighting.token != found.token:
            self._sightings[slot] = _Sighting(found.token, now)
            return found.lease.released
        return found.lease.released or now - sighting.first_seen >= self.ttl_s

    def unchanged_for(self, name: LeaseName | str) -> float:
        """Seconds the lease ``name`` has shown the same token, on this clock; 0 if never seen."""
        sighting = self._sightings.get(_slot(name))
        return 0.0 if sighting is None else self._clock() - sighting.first_seen

    def age(self, name: LeaseName | str) -> float | None:
        """Seconds since the lease ``name`` was last seen to change; None if never seen (read-only)."""
        sighting = self._sightings.get(_slot(name))
        return None if sighting is None else self._clock() - sighting.first_seen


def live_learners(store: RunStore, observer: LeaseObserver, own: Lease | None = None) -> dict[str, Lease]:
    """Learners whose lease has not expired in ``observer``'s judgement (a lease counts only at its
    own holder's key). ``own``: the lease this node's learner wrote last, taken as it is instead of
    read back (the node knows it is live; a released one is not)."""
    live: dict[str, Lease] = {}
    if own is not None and not own.released:
        live[own.holder] = own
    for learner in store.learners_with_leases():
        if own is not None and learner == own.holder:
            continue
        found = store.read_learner_lease(learner, need_token=False)
        if found is None or found.lease is None:
            continue
        lease = found.lease
        name = LeaseName.of_learner(learner)
        if lease.kind == "learner" and lease.holder == learner and not observer.expired(name, found):
            live[lease.holder] = lease
    return live


TRAINING = "training"
"""The key of a learner lease's ``info`` that is ``False`` while the learner does not train (an
``"either"`` node serving as the syncer, docs/session.md "Roles"): rounds do not wait for it."""


def trains(lease: Lease) -> bool:
    """Whether a learner's lease says it is training (every lease but a paused one's)."""
    return lease.info.get(TRAINING) is not False


def others_training(live: Mapping[str, Lease], me: str) -> int:
    """How many of the ``live`` learners other than ``me`` are training."""
    return sum(1 for learner, lease in live.items() if learner != me and trains(lease))


class LearnerLease:
    """A learner's own lease. The first write is a plain put (its id is its own: a restarted
    learner takes over its predecessor's lease); every later one is a compare-and-swap against
    the token of our last write, so a lease that changed under us means another process writes
    it: a second process with our id, when it holds a valid learner lease of our id
    (``DuplicateLearner``); anything else there (garbage, another holder's lease, one that
    does not verify in a signed run) is overwritten and logged. No request beyond the writes
    themselves, but for the read after a conflict."""

    def __init__(self, store: RunStore, learner: str, ttl_s: float) -> None:
        self._store = store
        self._learner = check_learner_id(learner)
        self._ttl_s = ttl_s
        self._sequence = 0
        self._token: str | None = None
        self.written: Lease | None = None
        """The lease as this learner last wrote it successfully (None before the first write)."""

    def renew(self, info: dict[str, object]) -> None:
        self._write(released=False, info=info)

    def release(self) -> None:
        self._write(released=True, info={})

    def _write(self, *, released: bool, info: dict[str, object]) -> None:
        self._sequence += 1
        lease = Lease(
            kind="learner", holder=self._learner, sequence=self._sequence, ttl_s=self._ttl_s, released=released, info=info
        )
        self._put(lease)
        self.written = lease

    def _put(self, lease: Lease) -> None:
        if self._token is None:
            self._token = self._store.put_learner_lease(lease)
            return
        try:
            self._token = self._store.swap_learner_lease(lease, self._token)
        except KeyNotFound:  # deleted under us (retention never does): write it again
            self._token = self._store.put_learner_lease(lease)
        except VersionConflict:
            found = self._store.read_learner_lease(self._learner, need_token=False)
            there = found.lease if found is not None else None
            if there is not None and there.kind == "learner" and there.holder == self._learner:
                raise DuplicateLearner(self._learner) from None  # a valid lease of our id that we did not write
            # garbage, another holder's, or (signed run) one that does not verify: not a twin
            log.warning("the lease of learner %s was overwritten by something no learner writes; writing it again", self._learner)
            self._token = self._store.put_learner_lease(lease)
