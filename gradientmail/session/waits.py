"""How a learner's training thread waits on the others, on the clock it is given.

Three waits, each bounded: for the commit of one fragment's contribution (``overlap_steps``,
an ``"either"`` node handing its work over, and close: at most ``commit_timeout_s``, and no
longer than a live syncer exists to commit it, ``SyncerWatch``), for its uploads to be in the
mailbox (``Session.wait_published``), and at close for the rounds other learners have open on
its newest versions (a lease TTL), so that learners that stop together end on the same version.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from gradientmail.errors import GradientMailError
from gradientmail.session.fragment import LearnerFragment
from gradientmail.store import LeaseName, LeaseObserver, RunStore

__all__ = ["Blocked", "CommitWaits", "SyncerWatch"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class SyncerWatch:
    """Whether any node still holds a live syncer lease: what a closing learner waits on.

    ``gone()`` is True once the lease has been absent, unreadable, released or expired (the
    run's TTL on this clock) for one more TTL — time for a new syncer to take over. Reads the
    lease at most once per poll interval."""

    def __init__(self, store: RunStore, ttl_s: float, poll_interval_s: float, clock: Clock = time.monotonic) -> None:
        self._store = store
        self._observer = LeaseObserver(ttl_s, clock)
        self._ttl_s = ttl_s
        self._poll_interval_s = poll_interval_s
        self._clock = clock
        self._checked_at = float("-inf")
        self._gone_since: float | None = None

    def gone(self) -> bool:
        now = self._clock()
        if now - self._checked_at >= self._poll_interval_s:
            self._checked_at = now
            try:
                found = self._store.leases.read_syncer()
            except GradientMailError:
                return False  # the store hiccuped: no evidence either way
            dead = found is None or self._observer.expired(LeaseName.SYNCER, found)
            self._gone_since = (self._gone_since or now) if dead else None
        return self._gone_since is not None and now - self._gone_since >= self._ttl_s


class Blocked(Protocol):
    blocked_s: float
    """Seconds the training thread has waited for commits."""


class CommitWaits:
    """The training thread's waits. ``changed`` is notified when the exchange has news (a commit
    ready); ``align_ready`` aligns with what is ready; ``stats.blocked_s`` adds up the time waited."""

    def __init__(
        self,
        learner_id: str,
        *,
        commit_timeout_s: float,
        poll_interval_s: float,
        changed: threading.Condition,
        align_ready: Callable[[], None],
        stats: Blocked,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.learner_id = learner_id
        self.commit_timeout_s = commit_timeout_s
        self.poll_interval_s = poll_interval_s
        self._changed = changed
        self._align_ready = align_ready
        self.clock = clock
        self._sleep = sleep
        self._stats = stats

    def deadline(self) -> float:
        """When a wait that starts now gives up: ``commit_timeout_s`` from now."""
        return self.clock() + self.commit_timeout_s

    def for_commit(self, state: LearnerFragment, deadline: float | None = None, watch: SyncerWatch | None = None) -> bool:
        """Block until ``state`` aligns with a version newer than its anchor now; False on
        timeout (its contribution is then forgotten), or when ``watch`` finds no live syncer."""
        started = self.clock()
        base_version = state.anchor_version
        deadline = started + self.commit_timeout_s if deadline is None else deadline
        with self._changed:
            while state.anchor_version <= base_version:
                self._align_ready()
                if state.anchor_version > base_version:
                    break
                remaining = deadline - self.clock()
                gone = watch is not None and watch.gone()
                if remaining <= 0 or gone:
                    log.warning(
                        "%s: no commit of fragment %d after version %d %s; continuing",
                        self.learner_id,
                        state.index,
                        base_version,
                        "and no live syncer to make it" if gone else f"within {self.commit_timeout_s:.0f} s",
                    )
                    state.outstanding = None
                    break
                self._changed.wait(min(remaining, self.poll_interval_s))
        self._stats.blocked_s += self.clock() - started
        return state.anchor_version > base_version

    def for_outstanding(self, fragments: Sequence[LearnerFragment], deadline: float, watch: SyncerWatch | None = None) -> None:
        """Wait for the commit of every fragment with a contribution out."""
        for state in fragments:
            if state.outstanding is not None:
                self.for_commit(state, deadline, watch)

    def until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Poll ``done`` (every 10 ms at most) until it holds; False after ``timeout_s``."""
        deadline = self.clock() + timeout_s
        while not done():
            if self.clock() >= deadline:
                return False
            self._sleep(min(0.01, self.poll_interval_s))
        return True

    def for_open_rounds(self, store: RunStore, fragments: Sequence[LearnerFragment], ttl_s: float) -> None:
        """Give rounds other learners have open on our newest versions a lease TTL to commit,
        so learners that stop together end on the same newest version."""
        deadline = self.clock() + ttl_s
        for state in fragments:
            while self.clock() < deadline:
                newest = store.newest_version(state.index, known=state.anchor_version) or 0
                if not store.contributors(state.index, newest):
                    break
                self._sleep(self.poll_interval_s)
