"""The learners' leases as a node that closes rounds reads them: who is live now.

A round waits for the live learners that train (quorum, or "every live learner is in"), the
pacing reads their ``due_in_s`` hints, and telemetry shows how long each lease has stood still
and how many expired unreleased. ``LiveLearners`` holds that view and the one observer that
judges expiry (``store.leases.LeaseObserver``); the runtime decides when to read it
(``pacing.SyncerPacing.leases_in``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gradientmail.records import Lease
from gradientmail.store import LeaseName, LeaseObserver, LeaseRead, RunStore, live_learners, trains

__all__ = ["LiveLearners"]


class LiveLearners:
    """The live set one read of the learners' leases found (one LIST, a GET of each but ``own``)."""

    def __init__(self, store: RunStore, observer: LeaseObserver, own: Callable[[], Lease | None]) -> None:
        self._store = store
        self.observer = observer
        self._own = own
        """The lease this node's learner last wrote: taken as it is, unread."""
        self.leases: dict[str, Lease] = {}
        """Learner → its live lease, as of the last read."""
        self.expired = 0
        """Learner leases judged expired unreleased (each version once; for telemetry)."""
        self._expired_tokens: dict[str, str] = {}
        """Learner → the token of its lease last counted in ``expired``."""

    def read(self) -> None:
        self.leases = live_learners(self._store, self.observer, own=self._own(), on_expired=self._lease_expired)

    def clear(self) -> None:
        """Not closing rounds: only nodes that do watch the learners' leases."""
        self.leases = {}

    def training(self) -> set[str]:
        """The live learners a round may wait for: those whose lease says they train (an
        ``"either"`` node serving as the syncer does not)."""
        return {learner for learner, lease in dict(self.leases).items() if trains(lease)}

    def ages(self) -> dict[str, float]:
        """Seconds since each live learner's lease last changed, on this node's clock."""
        return {learner: self.observer.unchanged_for(LeaseName.of_learner(learner)) for learner in dict(self.leases)}

    def expiries(self) -> Iterator[float]:
        """Seconds until each live lease has stood still a TTL (expired, if not renewed)."""
        ttl_s = self.observer.ttl_s
        return (ttl_s - age for age in self.ages().values())

    def _lease_expired(self, learner: str, found: LeaseRead) -> None:
        """Count a learner lease judged expired unreleased, once per version of it (a lease seen
        live that stopped, or one already dead at this node's first read after its election)."""
        if self._expired_tokens.get(learner) != found.token:
            self._expired_tokens[learner] = found.token
            self.expired += 1
