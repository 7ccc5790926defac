"""The syncer runtime every node runs: hold the election, and while elected close rounds.

Per fragment, the elected node keeps the newest committed version (parameters and outer
state, loaded from the mailbox alone when it takes over) and the round open on it:

    collect  → list contribution records; accept or reject each (reason codes)
    quorum   → ``quorum_size`` accepted, or every live learner has one accepted
    grace    → wait the adaptive grace window for more reports (see ``grace.py``)
    merge    → configured merge with weights samples²/steps, then the Nesterov outer step
    commit   → blobs under attempt-unique keys, then create the round record once

A node that loses the create-once race drops its result and reloads; it never overwrites.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gradientmail.backends import Backend
from gradientmail.errors import GradientMailError, KeyNotFound
from gradientmail.polling import PollingLoop
from gradientmail.records import Lease, Participant, Rejection, RoundRecord, RoundTiming, keys
from gradientmail.store import LeaseObserver, RunSpec, RunStore, live_learners
from gradientmail.syncer.election import Election
from gradientmail.syncer.grace import GraceEstimator
from gradientmail.syncer.rounds import Accepted, Base, load_base, merge_round, outer_step, validate
from gradientmail.telemetry import hooks as telemetry

__all__ = ["SyncerRuntime"]

log = logging.getLogger(__name__)


@dataclass
class OpenRound:
    """The round collecting contributions against ``base_version``."""

    base_version: int
    opened_at: float = 0.0
    """Syncer clock when the round opened (its base was committed or loaded)."""
    seen: set[str] = field(default_factory=set)
    accepted: list[Accepted] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    first_seen_at: float | None = None
    last_seen_at: float | None = None
    """When the latest accepted contribution arrived: with ``first_seen_at``, the arrival spread."""
    quorum_at: float | None = None
    grace_s: float = 0.0
    fetch_s: float = 0.0
    accepted_at_quorum: int = 0

    @property
    def learners(self) -> set[str]:
        return {a.contribution.learner for a in self.accepted}

    @property
    def learner_bases(self) -> set[tuple[str, int]]:
        """(learner, base version) of each accepted contribution: one of each may be merged."""
        return {(a.contribution.learner, a.contribution.anchor_version) for a in self.accepted}


@dataclass
class FragmentView:
    version: int
    record: RoundRecord
    base: Base
    round: OpenRound


class SyncerRuntime:
    """Runs the election and, while elected, the rounds of every fragment (one thread)."""

    def __init__(
        self,
        store: RunStore,
        backend: Backend,
        spec: RunSpec,
        node_id: str,
        *,
        lease_ttl_s: float,
        poll_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.backend = backend
        self.spec = spec
        self.node_id = node_id
        self._clock = clock
        self.election = Election(store, node_id, lease_ttl_s, clock)
        self._observer = LeaseObserver(clock)
        self._views: dict[int, FragmentView] = {}
        algorithm = spec.algorithm
        self._grace = [GraceEstimator(algorithm.grace_gamma, algorithm.grace_tau, algorithm.grace_max_s) for _ in spec.fragments]
        self._referenced: dict[tuple[int, int], frozenset[str]] = {}
        self._loop = PollingLoop(f"gm-syncer-{node_id}", self.run_once, poll_interval_s)
        self.live: dict[str, Lease] = {}
        self.commits = 0
        self.lost_races = 0
        self.learner_leases_expired = 0
        """Learner leases this node saw expire unreleased (every node watches them all; for telemetry)."""

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()
        telemetry.attach_syncer(self)

    def stop(self, resign: bool = True) -> None:
        self._loop.stop()
        if resign:
            try:
                self.election.resign()
            except GradientMailError as exc:
                log.warning("could not release the syncer lease: %s", exc)

    # -- one pass ------------------------------------------------------------------
    def run_once(self) -> None:
        """One pass: election, live learners, and (if elected) every fragment's round."""
        leader = self.election.poll()
        previous, self.live = self.live, live_learners(self.store, self._observer)
        self._count_expired(previous)
        if not leader:
            self._views.clear()  # a future term recovers from the mailbox alone
            return
        for fragment in range(len(self.spec.fragments)):
            if self._loop.stopping or not self.election.is_leader:
                return
            self._advance(fragment)

    def _advance(self, fragment: int) -> None:
        view = self._views.get(fragment)
        newest = self.store.newest_version(fragment, known=view.version if view else None)
        if newest is None:
            return  # not initialised yet by the first learner
        if view is None or newest > view.version:
            committed = self.store.load_version(self.spec, fragment, newest)
            view = FragmentView(
                newest, committed.record, load_base(self.backend, committed), OpenRound(newest, opened_at=self._clock())
            )
            self._views[fragment] = view
        self._collect(fragment, view)
        current = view.round
        if not current.accepted:
            return
        now = self._clock()
        everyone = set(self.live) <= current.learners
        if current.quorum_at is None:
            if len(current.accepted) < self.spec.algorithm.quorum_size and not everyone:
                return
            current.quorum_at = now
            current.accepted_at_quorum = len(current.accepted)
            grace = self._grace[fragment]
            grace.observe_step_times(a.contribution.step_time_s for a in current.accepted)
            current.grace_s = 0.0 if everyone else grace.window(now - (current.first_seen_at or now))
        if not everyone and now < current.quorum_at + current.grace_s:
            return
        self._close(fragment, view)

    def _collect(self, fragment: int, view: FragmentView) -> None:
        current = view.round
        for key in self.store.contributions(fragment):
            if key.record in current.seen or key.base_version > view.version:
                continue  # a newer base means our view lags; the next pass reloads
            current.seen.add(key.record)
            if key.base_version < view.version and not self._mergeable_late(fragment, key, view):
                self._old_contribution(fragment, key, view)
                continue
            started = self._clock()
            outcome = validate(self.store, self.backend, self.spec, view.version, key)
            current.fetch_s += self._clock() - started
            if isinstance(outcome, Rejection):
                current.rejected.append(outcome)
            elif (outcome.contribution.learner, outcome.contribution.anchor_version) in current.learner_bases:
                current.rejected.append(
                    Rejection(
                        learner=key.learner,
                        contribution=key.record,
                        reason="duplicate",
                        detail="second contribution against this version",
                    )
                )
            else:
                current.accepted.append(outcome)
                current.last_seen_at = self._clock()
                if current.first_seen_at is None:
                    current.first_seen_at = current.last_seen_at

    def _mergeable_late(self, fragment: int, key: keys.ContributionKey, view: FragmentView) -> bool:
        """A contribution based on an older version that ``max_staleness`` lets into this round:
        within the bound, and in no round record yet (neither merged nor rejected)."""
        if view.version - key.base_version > self.spec.algorithm.max_staleness:
            return False
        return not any(key.record in self._keys_listed_by(fragment, v) for v in range(key.base_version + 1, view.version + 1))

    def _old_contribution(self, fragment: int, key: keys.ContributionKey, view: FragmentView) -> None:
        """A contribution against an older version: garbage once merged, else stale."""
        last_round = key.base_version + 1 + self.spec.algorithm.max_staleness  # the last round that could list it
        if any(
            key.record in self._keys_listed_by(fragment, v)
            for v in range(key.base_version + 1, min(last_round, view.version) + 1)
        ):
            if last_round < view.version:  # keep the inputs of every round that could still be replayed
                self.store.delete_contribution(key)
            return
        view.round.rejected.append(
            Rejection(
                learner=key.learner,
                contribution=key.record,
                reason="stale",
                detail=f"based on version {key.base_version}, current is {view.version}",
            )
        )

    def _keys_listed_by(self, fragment: int, version: int) -> frozenset[str]:
        cached = self._referenced.get((fragment, version))
        if cached is None:
            try:
                record = self.store.read_round(fragment, version)
            except KeyNotFound:
                return frozenset()
            cached = frozenset([p.contribution for p in record.participants] + [r.contribution for r in record.rejected])
            self._referenced[(fragment, version)] = cached
        return cached

    def _close(self, fragment: int, view: FragmentView) -> None:
        current = view.round
        started = self._clock()
        merged, final = merge_round(self.backend, self.spec, current.accepted)
        merged_at = self._clock()
        params, state = outer_step(self.backend, self.spec, view.base, merged, final)
        stepped_at = self._clock()
        participants = tuple(
            Participant(
                learner=a.contribution.learner,
                contribution=a.key.record,
                steps=a.contribution.steps,
                samples=a.contribution.samples,
                weight=a.weight,
                carried_steps=a.contribution.carried_steps,
                staleness=a.staleness,
                realigned=a.contribution.realigned,
            )
            for a in current.accepted
        )
        quorum_wait = (current.quorum_at or started) - (current.first_seen_at or started)
        record = self.store.commit_version(
            fragment,
            view.version + 1,
            {name: self.backend.to_numpy(tensor) for name, tensor in params.items()},
            {name: self.backend.to_numpy(tensor) for name, tensor in state.to_tensors().items()},
            algorithm=self.spec.algorithm,
            committed_by=self.node_id,
            term=self.election.term,
            base_version=view.version,
            participants=participants,
            rejected=tuple(current.rejected),
            final=final,
            timing=RoundTiming(
                quorum_wait_s=quorum_wait,
                grace_s=current.grace_s,
                sync_s=current.fetch_s + self._clock() - started,
                arrival_spread_s=(current.last_seen_at or started) - (current.first_seen_at or started),
            ),
        )
        committed_at = self._clock()
        if record is None:
            self.lost_races += 1
            log.info("node %s lost the race for fragment %d version %d", self.node_id, fragment, view.version + 1)
            del self._views[fragment]
            return
        self._grace[fragment].observe_sync(current.fetch_s + self._clock() - started)
        self.commits += 1
        self._referenced[(fragment, record.version)] = frozenset(
            [p.contribution for p in participants] + [r.contribution for r in current.rejected]
        )
        for rejection in current.rejected:
            stale = keys.parse_contribution_record(rejection.contribution) if rejection.reason == "stale" else None
            if stale is not None:
                self.store.delete_contribution(stale)
        self._views[fragment] = FragmentView(
            record.version, record, Base(params, state), OpenRound(record.version, opened_at=committed_at)
        )
        telemetry.round_committed(
            self,
            fragment,
            record,
            telemetry.RoundPhases(
                opened_at=current.opened_at,
                first_seen_at=current.first_seen_at or started,
                quorum_at=current.quorum_at or started,
                closing_at=started,
                merged_at=merged_at,
                stepped_at=stepped_at,
                committed_at=committed_at,
                now=self._clock(),
                grace_window_s=current.grace_s,
                grace_contributions=len(current.accepted) - current.accepted_at_quorum,
                fetch_s=current.fetch_s,
                fetched_bytes=sum(a.contribution.payload.size_bytes for a in current.accepted),
            ),
        )

    def committed(self) -> dict[int, RoundRecord]:
        """The newest committed round record of each fragment, as this node tracks it while elected."""
        return {fragment: view.record for fragment, view in list(self._views.items())}

    def _count_expired(self, previous: dict[str, Lease]) -> None:
        """Count learners that left the live set because their lease went unrenewed for a TTL
        (a released lease changed token just before, so it has not stood still that long)."""
        for learner in previous.keys() - self.live.keys():
            if self._observer.unchanged_for(keys.learner_lease(learner)) >= previous[learner].ttl_s:
                self.learner_leases_expired += 1
