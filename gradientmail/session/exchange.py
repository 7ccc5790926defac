"""The learner's background exchange: publish contributions, fetch commits, renew the lease.

Transfers run on one polling loop and the lease on another, so a slow upload never delays a
renewal. Both touch only NumPy arrays and the store, never the model: the training thread
hands deltas already copied to host memory and takes back fetched commits as host arrays,
converting them between steps.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gradientmail.errors import GradientMailError, KeyNotFound
from gradientmail.polling import PollingLoop
from gradientmail.records import RoundRecord
from gradientmail.store import ContributionCounts, LearnerLease, RunSpec, RunStore

__all__ = ["Commit", "Exchange", "Publication"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Publication:
    """A delta ready to go, as host arrays, with the counts it reports."""

    fragment: int
    anchor_version: int
    delta: dict[str, np.ndarray]
    counts: ContributionCounts


@dataclass(frozen=True)
class Commit:
    """A committed version fetched for alignment, as host arrays."""

    fragment: int
    version: int
    params: dict[str, np.ndarray]
    base_version: int
    """The version the learner was aligned with when this was fetched."""
    ours_merged: bool
    """Whether the round built on ``base_version`` merged a contribution of this learner."""


class Exchange:
    """Background worker for one learner. ``on_change`` is called when a commit is ready.

    ``lease_info`` says what the learner's lease tells observers; it is called at each
    renewal (on this thread), never per step.
    """

    def __init__(
        self,
        store: RunStore,
        spec: RunSpec,
        learner_id: str,
        known_versions: list[int],
        *,
        lease_ttl_s: float,
        poll_interval_s: float,
        on_change: Callable[[], None],
        lease_info: Callable[[], dict[str, object]],
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._spec = spec
        self._learner = learner_id
        self._known = list(known_versions)
        self._lease = LearnerLease(store, learner_id, lease_ttl_s)
        self._lease_info = lease_info
        self._lease_loop = PollingLoop(f"gm-lease-{learner_id}", self._renew_lease, lease_ttl_s / 3)
        self._head_every_s = lease_ttl_s
        self._head_checked_at = float("-inf")
        self._clock = clock
        self._on_change = on_change
        self._outbox: queue.Queue[Publication] = queue.Queue()
        self._ready: dict[int, Commit] = {}
        self._lock = threading.Lock()
        self._loop = PollingLoop(f"gm-exchange-{learner_id}", self._pass, poll_interval_s)
        self._next_sequence = 1
        self.open_rounds: dict[int, int] = {}
        """Fragment → the version other learners have opened a round on (see ``_watch_rounds``)."""
        self.bytes_published = 0
        self.bytes_fetched = 0

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._renew_lease()
        self._lease_loop.start()
        self._loop.start()

    def stop(self, release_lease: bool = True) -> None:
        self._loop.stop()
        self._lease_loop.stop()
        self._drain_outbox()
        if release_lease:
            try:
                self._lease.release()
            except GradientMailError as exc:
                log.warning("could not release the lease of %s: %s", self._learner, exc)

    # -- the training thread's side -----------------------------------------------
    def publish(self, publication: Publication) -> None:
        self._outbox.put(publication)
        self._loop.wake()

    def take_ready(self) -> dict[int, Commit]:
        with self._lock:
            ready, self._ready = self._ready, {}
        return ready

    def idle(self) -> bool:
        """True when nothing waits to be published."""
        return self._outbox.unfinished_tasks == 0

    # -- the background side -------------------------------------------------------
    def _pass(self) -> None:
        self._drain_outbox()
        self._fetch_commits()
        self._watch_rounds()

    def _drain_outbox(self) -> None:
        while True:
            try:
                publication = self._outbox.get_nowait()
            except queue.Empty:
                return
            try:
                key, size = self._store.publish_contribution(
                    self._learner,
                    publication.fragment,
                    publication.anchor_version,
                    publication.delta,
                    publication.counts,
                    first_sequence=self._next_sequence,
                )
                self._next_sequence = key.sequence + 1
                self.bytes_published += size
            finally:
                self._outbox.task_done()

    def _fetch_commits(self) -> None:
        # Probing forward from what we know is the cheap common case; once a TTL, start from the
        # head pointer instead, so a learner left behind by retention still finds the newest.
        from_head = self._clock() - self._head_checked_at >= self._head_every_s
        if from_head:
            self._head_checked_at = self._clock()
        for fragment, known in enumerate(self._known):
            newest = self._store.newest_version(fragment, known=None if from_head else known)
            if newest is None or newest <= known:
                continue
            record = self._store.read_round(fragment, newest)
            params = self._store.read_params(self._spec, record)
            self.bytes_fetched += record.params.size_bytes
            ours = any(p.learner == self._learner for p in self._round_built_on(fragment, known, newest, record).participants)
            self._known[fragment] = newest
            with self._lock:
                waiting = self._ready.get(fragment)  # not aligned with yet: the learner's base is still its base
                base, ours = (waiting.base_version, waiting.ours_merged) if waiting is not None else (known, ours)
                self._ready[fragment] = Commit(fragment, newest, params, base, ours)
            self._on_change()

    def _round_built_on(self, fragment: int, known: int, newest: int, record: RoundRecord) -> RoundRecord:
        """The round that followed ``known`` (``record`` itself when it did); an empty one when
        retention already collected it (we were far behind: nothing of ours was in it)."""
        if newest == known + 1:
            return record
        try:
            return self._store.read_round(fragment, known + 1)
        except KeyNotFound:
            return record.model_copy(update={"participants": ()})

    def _watch_rounds(self) -> None:
        """Notice rounds other learners have opened on our versions, so we can join them early:
        one short of quorum (quorum ≥ 2), or any open round (quorum 1, where the grace window
        waits for late arrivals)."""
        needed = max(1, self._spec.algorithm.quorum_size - 1)
        opened = {
            fragment: known
            for fragment, known in enumerate(self._known)
            if len(self._store.contributors(fragment, known) - {self._learner}) >= needed
        }
        if opened != self.open_rounds:
            self.open_rounds = opened
            if opened:
                self._on_change()

    def _renew_lease(self) -> None:
        self._lease.renew(self._lease_info())
