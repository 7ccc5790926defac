"""The syncer runtime every node runs: hold the election, and while elected close rounds.

Per fragment, the elected node keeps the newest committed version (parameters and outer
state, loaded from the mailbox alone when it takes over) and the round open on it:

    collect  → list contribution records; accept or reject each (reason codes), in the order
               listed; the next ``PREFETCH`` are fetched, hashed and decoded meanwhile
    quorum   → ``quorum_size`` accepted, or every live learner has one accepted
    grace    → wait the adaptive grace window for more reports (see ``grace.py``)
    close    → ``rounds.close_round``, the rule replay shares (INV-4): weights samples²/steps
               (samples per step capped, see ``bounds.py``), the configured merge, the outer
               step; a non-finite result is never committed, the round is retried without
               its largest delta
    commit   → the draft becomes a ``VersionDraft``; ``RunStore.commit_version`` writes the
               blobs under attempt-unique keys, creates the round record once (naming the
               previous record's digest), then moves the head pointer
    collect  → retention: ``store.sweep.RetentionSweep`` deletes what the policy no
               longer keeps

A node that loses the create-once race drops its result and reloads; it never overwrites.
The election runs on a thread of its own, so lease renewals never wait behind transfers.

Polling (docs/session.md, "Polling"; the schedule is ``pacing.SyncerPacing``): only the
elected node reads the learners' leases, every ``idle_interval_s`` (a third of the lease TTL
by default: how often they are renewed), or every ``poll_interval_s`` while a round waits for
quorum. The others read only the syncer lease, at the same idle pace, and at
``poll_interval_s`` once it has stood still long enough to expire. While elected, a full pass
lists each fragment's contributions (one LIST); it runs every ``poll_interval_s`` after any
activity and inside the windows the learners' leases announce, and backs off (×2 per quiet
pass) to the idle interval while nothing arrives. The head pointer is probed (a HEAD) once per
``HEAD_PROBE_TTLS`` TTLs, or when a listed contribution names a newer base. A round becomes
due when a contribution is seen, or a learner in this process says it uploaded one
(``contribution_published``): the loop then hurries, and the passes in between look only at
the fragments with a round pending; during a grace window the next pass is timed for its end.
A commit is announced to ``on_commit`` (the learner in this process fetches it at once), and
the syncer lease carries the bulletin (``bulletin()``: heads and open rounds), renewed at once
after a commit, a round's first accepted contribution or its quorum, which the other nodes'
learners follow.

The two threads run the public passes ``election_pass`` and ``rounds_pass``; tests and tools
drive the same ones (or ``run_once``, everything at once whatever the pace).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from gradientmail.algorithms.merge import MergeSum
from gradientmail.backends import Backend
from gradientmail.errors import CorruptPayload, GradientMailError, InvalidRecord, KeyNotFound
from gradientmail.polling import PollingLoop, RepeatedFailures, idle_interval
from gradientmail.records import Lease, Rejection, RoundRecord, RoundTiming, keys
from gradientmail.store import (
    UNKNOWN_HEAD,
    CommittedVersion,
    LeaseName,
    LeaseObserver,
    LeaseRead,
    OpenRoundNote,
    RetentionSweep,
    RoundsBulletin,
    RunSpec,
    RunStore,
    StoredRound,
    VersionDraft,
    live_learners,
    trains,
)
from gradientmail.store.store_clock import StoreClock
from gradientmail.syncer.assignment import assign_fragments, closers, orphaned
from gradientmail.syncer.bounds import ROUND_CONTRIBUTION_LIMIT, SEED_ROUNDS, ContributionHistory
from gradientmail.syncer.election import Election
from gradientmail.syncer.grace import GraceEstimator
from gradientmail.syncer.pacing import HEAD_PROBE_TTLS, SyncerPacing
from gradientmail.syncer.repair import restore_version
from gradientmail.syncer.rounds import (
    AbandonedRound,
    Accepted,
    Base,
    Fetched,
    Handed,
    RoundDraft,
    check_fetched,
    close_round,
    fetch_contribution,
    load_base,
    round_sum,
)
from gradientmail.telemetry import hooks as telemetry

__all__ = ["RoundView", "SyncerRuntime"]

log = logging.getLogger(__name__)

QUORUM_TIMES_KEPT = 8
"""Closed rounds per fragment whose quorum time is kept (the lateness of contributions that
arrive after their round, for ``grace_rule="arrivals"``)."""

HANDED_KEPT = 64
"""Contributions of this node's learner kept in memory for its syncer at most (each is taken by
the round that examines it, or dropped when a commit makes it stale)."""
ASSIGNMENT_KEPT_TTLS = 3
"""In a spread run, a node keeps closing the fragments the newest assignment it read gave it for
this many lease TTLs without reading a newer one (a coordinator being replaced); past that it
stops (it is cut off from the store, or the run has no coordinator)."""
PREFETCH = 2
STALE_DELETES_PER_COMMIT = 64
"""Stale contributions a commit deletes at once, one request each; a flood's thousands are left
to retention, which deletes contributions once their base ages out of the audit window."""
STRANGERS_PER_PASS = 16
"""Contributions of ids neither live nor in the round before that one pass examines: a flood of
records under made-up ids costs a pass at most this many reads and never holds a round up."""
"""Contributions fetched (record, payload, sha256, decode) at once, ahead of the one being
checked: enough to keep the transfers going while the syncer checks one, and bounded, so the
syncer holds at most this many payloads beyond the ones it accepted."""


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
    hurried: bool = False
    """Whether the syncer's loop hurried for this round already (once per round: a bounded cost)."""
    lagging: bool = False
    """A listed contribution names a base newer than ours: probe for the newer version next pass."""
    examined: int = 0
    """New contributions this round fetched or chose to (``ROUND_CONTRIBUTION_LIMIT``)."""
    summed: MergeSum | None = None
    """The merge of ``accepted`` summed as they were accepted (``merge_arithmetic="streamed"``);
    ``close_round`` takes it when it still holds exactly the round's participants."""

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
    record_sha256: str = ""
    """Digest of ``record``'s stored bytes: the next version's ``previous``."""


@dataclass(frozen=True)
class RoundView:
    """A read-only look at the round open on one fragment (for tests, tools and telemetry)."""

    base_version: int
    seen: frozenset[str]
    """Contribution record keys the round has looked at (judged, or set aside as old)."""
    accepted: int
    rejected: int
    quorum_at: float | None
    """Syncer clock when quorum was reached; None while the round waits for it."""
    grace_s: float
    """The grace window after quorum (0 until quorum, or when every live learner is in)."""


@dataclass
class WatchedFragment:
    """A fragment another node closes, as the coordinator of a spread run follows it for its
    bulletin: the newest version it found, and the contributions listed on it."""

    version: int
    listed: int = 0


class SyncerRuntime:
    """Runs the election and, while elected, the rounds of every fragment (one thread each); in
    a spread run (``syncer_layout="spread"``) the rounds of the fragments assigned to this node."""

    def __init__(
        self,
        store: RunStore,
        backend: Backend,
        spec: RunSpec,
        node_id: str,
        *,
        poll_interval_s: float,
        lease_ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_commit: Callable[[CommittedVersion], None] | None = None,
        idle_interval_s: float | None = None,
        dedicated: bool = False,
        on_syncer_lease: Callable[[LeaseRead | None], None] | None = None,
        own_lease: Callable[[], Lease | None] | None = None,
        watch_every: Callable[[], float | None] | None = None,
        store_clock: StoreClock | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.spec = spec
        self.node_id = node_id
        self._clock = clock
        ttl_s = spec.lease_ttl_s if lease_ttl_s is None else lease_ttl_s
        self.election = Election(
            store,
            node_id,
            ttl_s,
            clock,
            dedicated=dedicated,
            info=lambda: self.bulletin().to_info(),
            announce_gap_s=poll_interval_s,
            on_read=self._syncer_lease_read,
            store_clock=store_clock,
        )
        self._on_syncer_lease = on_syncer_lease
        self.spread = spec.algorithm.syncer_layout == "spread"
        self._fragment_bytes = [spec.fragment_bytes(f) for f in range(len(spec.fragments))]
        self._assign: tuple[str, ...] = ()
        """While elected in a spread run: the assignment this node computed and announces."""
        self._read_assign: tuple[tuple[str, ...], float] | None = None
        """In a spread run, not elected: the newest assignment read in a live syncer lease, and when."""
        self._interim: dict[int, float] = {}
        """While elected in a spread run: fragments whose owner left, which this node closes until
        their new owner has surely read the assignment (fragment → until, on this clock)."""
        self._assignment_pending = False
        """In a spread run: the live syncer lease read last has no assignment yet (a new coordinator)."""
        self._watched: dict[int, WatchedFragment] = {}
        """While elected in a spread run: the fragments other nodes close, followed for the bulletin."""
        self._observer = LeaseObserver(ttl_s, clock, store_clock)
        self._views: dict[int, FragmentView] = {}
        algorithm = spec.algorithm
        self._grace = [
            GraceEstimator(
                algorithm.grace_gamma,
                algorithm.grace_tau,
                algorithm.grace_max_s,
                rule=algorithm.grace_rule,
                periods=algorithm.grace_periods,
                sync_every=algorithm.sync_every,
                margin_s=poll_interval_s,
            )
            for _ in spec.fragments
        ]
        self._quorum_at: dict[tuple[int, int], float] = {}
        """(fragment, base version) → when the round built on it reached quorum, for the rounds
        we closed lately: how late a contribution that comes after its round closed arrived."""
        self._history = [ContributionHistory() for _ in spec.fragments]
        self._fragment_failures = [
            RepeatedFailures(log, f"node {node_id}: fragment {f}", clock) for f in range(len(spec.fragments))
        ]
        self._referenced: dict[tuple[int, int], frozenset[str]] = {}
        """(fragment, version) → the contribution keys its record lists (late and old ones' check)."""
        self._retention = RetentionSweep(store, spec.retention, algorithm.max_staleness)
        self._pacing = SyncerPacing(
            poll_interval_s,
            idle_interval(poll_interval_s, ttl_s, idle_interval_s),
            head_probe_s=HEAD_PROBE_TTLS * ttl_s,
            me=node_id,
            sync_every=algorithm.sync_every,
        )
        self._loop = PollingLoop(f"gm-syncer-{node_id}", self.rounds_pass, poll_interval_s)
        self._election_loop = PollingLoop(f"gm-election-{node_id}", self.election_pass, poll_interval_s)
        self._activity = False
        self._on_commit = on_commit
        self._own_lease = own_lease or (lambda: None)
        self._watch_every = watch_every or (lambda: None)
        """How often to watch the syncer lease while this node's learner awaits a commit (None: idle pace)."""
        """The lease this node's learner last wrote: the live set takes it as is, unread."""
        self._notified: set[int] = set()
        self._handed: dict[str, Handed] = {}
        """Contribution record key → what this node's learner published, handed in memory."""
        self._notified_lock = threading.Lock()
        self.live: dict[str, Lease] = {}
        self._judged_stale: set[tuple[int, str]] = set()
        """(fragment, contribution key) rejected stale by a round this node committed: not again."""
        self._ghost_heads: set[tuple[int, int]] = set()
        """(fragment, version) of heads naming a record that is gone, reported once each."""
        self.commits = 0
        self.forged_rounds_removed = 0
        """Unreadable newest round records this node deleted (``RunStore.remove_unreadable_round``)."""
        self.blobs_restored = 0
        """Blobs of a loaded version this node rewrote by replay (``syncer.repair``)."""
        self.lost_races = 0
        self.learner_leases_expired = 0
        """Learner leases this node judged expired unreleased while closing rounds (only such a node
        watches them; for telemetry): each version once."""
        self._expired_tokens: dict[str, str] = {}
        """Learner → the token of its lease last counted in ``learner_leases_expired``."""

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self.election_pass()
        self._election_loop.start()
        self._loop.start()
        telemetry.attach_syncer(self)

    def stop(self, resign: bool = True) -> None:
        self._loop.stop()
        self._election_loop.stop()
        if resign:
            try:
                self.election.resign()
            except GradientMailError as exc:
                log.warning("could not release the syncer lease: %s", exc)

    @property
    def loop(self) -> PollingLoop:
        """The rounds thread's loop (runs ``rounds_pass``)."""
        return self._loop

    def training_learners(self) -> set[str]:
        """The live learners a round may wait for: those whose lease says they train (an
        ``"either"`` node serving as the syncer does not)."""
        return {learner for learner, lease in dict(self.live).items() if trains(lease)}

    @property
    def election_loop(self) -> PollingLoop:
        """The election thread's loop (runs ``election_pass``)."""
        return self._election_loop

    @property
    def leases_read_at(self) -> float:
        """Syncer clock when the learners' leases were last read (-inf: not while elected)."""
        return self._pacing.leases_read_at

    # -- the passes ----------------------------------------------------------------
    def run_once(self) -> None:
        """One pass: election, live learners, and (if elected) every fragment's round (what the
        two threads do between them, in one call, reading everything whatever the pace: for
        tests and tools)."""
        self.election.poll()
        self._pacing.forget(election_read_at=self._clock())  # a full pass, whenever the last one was
        self.rounds_pass()
        if not self.election.is_leader:
            self._read_leases()  # the background passes of a node not elected leave them unread

    def election_pass(self) -> None:
        """The election thread's pass. The holder renews when due (no request otherwise); a
        watcher reads the syncer lease at the pace ``SyncerPacing.election_due`` sets."""
        election = self.election
        now = self._clock()
        due = self._pacing.election_due(
            now,
            holder=election.is_leader,
            lease_age_s=election.lease_age(),
            ttl_s=election.ttl_s,
            watch_every_s=self._pacing.poll_interval_s if self._assignment_pending else self._watch_every(),
        )
        if not due:
            return
        self._pacing.election_read_at = now
        held = election.is_leader
        if election.poll() and not held:
            self._loop.wake()  # elected: the rounds (and a spread run's assignment) start now
        probe_in = election.next_probe_in()
        if probe_in is not None:  # the holder's next renewal also pins the store's clock
            self._election_loop.pause_at_most(probe_in)

    def assigned(self) -> frozenset[int]:
        """The fragments whose rounds this node closes now: every one while elected; in a spread
        run, those the assignment gives it (its own while elected, else the newest it read in a
        live syncer lease within ``ASSIGNMENT_KEPT_TTLS`` TTLs)."""
        leader = self.election.is_leader
        if not self.spread:
            return frozenset(range(len(self.spec.fragments))) if leader else frozenset()
        if leader:
            now = self._clock()
            interim = {f for f, until in self._interim.items() if until > now}
            return frozenset(f for f, node in enumerate(self._assign) if node == self.node_id) | interim
        else:
            found = self._read_assign
            if found is None or self._clock() - found[1] > ASSIGNMENT_KEPT_TTLS * self.election.ttl_s:
                return frozenset()
            assign = found[0]
        return frozenset(f for f, node in enumerate(assign) if node == self.node_id)

    def rounds_pass(self) -> None:
        """The rounds thread's pass, at its pace: over the fragments this node closes
        (``assigned``), a full pass when due, else over those with a round pending or announced;
        then the next pause. In a spread run the elected node also follows the other fragments
        for its bulletin. With nothing to close: forget the rounds (a future term or assignment
        recovers from the mailbox)."""
        now = self._clock()
        with self._notified_lock:
            notified, self._notified = self._notified, set()
        pacing = self._pacing
        leader = self.election.is_leader
        if not leader:
            self._assign, self._watched, self._interim = (), {}, {}
        if leader and self.spread and pacing.leases_due(self._leases_in(now)):
            self._read_leases()  # the assignment follows the live set
        mine = self.assigned()
        if not mine and not leader:
            self._views.clear()  # a future term recovers from the mailbox alone
            with self._notified_lock:
                self._handed.clear()
            self.live = {}  # only nodes that close rounds watch the learners' leases
            pacing.stand_down()
            self._loop.settle()
            return
        for fragment in [f for f in self._views if f not in mine]:
            del self._views[fragment]  # assigned to another node now: its rounds are that node's
        if pacing.leases_due(self._leases_in(now)):
            self._read_leases()
        full = pacing.start_pass(now)
        pending = {f for f, view in self._views.items() if view.round.accepted}
        fragments = sorted(mine) if full else sorted((notified | pending) & mine)
        self._activity = bool(notified)
        if leader and self.spread and full:
            self._follow_others(mine)
        for fragment in fragments:
            if self._loop.stopping or fragment not in self.assigned():
                return
            try:  # one fragment that cannot advance (an object it cannot read) holds up no other
                self.advance(fragment)
            except GradientMailError as exc:
                self._fragment_failures[fragment].failed(str(exc))
            else:
                self._fragment_failures[fragment].recovered()
        busy = any(view.round.accepted for view in self._views.values())
        now = self._clock()
        pace = pacing.end_pass(now, full=full, active=self._activity, busy=busy, leases_in_s=self._leases_in(now))
        self._loop.interval_s = pace.interval_s
        self._loop.pause_at_most(pace.pause_at_most_s)
        if not busy and not notified:
            self._loop.settle()  # no round due: back to the regular pace

    def contribution_published(self, fragment: int, handed: Handed | None = None) -> None:
        """A learner in this process uploaded a contribution to ``fragment``: look now, and
        hurry until its round commits (or the hurry's bound). ``handed``: its record and arrays,
        which this node takes instead of reading them back while it holds the election."""
        with self._notified_lock:
            self._notified.add(fragment)
            if handed is not None and fragment in self.assigned() and len(self._handed) < HANDED_KEPT:
                self._handed[handed.key.record] = handed
        self._loop.hurry()

    # -- what a round looks like ---------------------------------------------------
    def open_round(self, fragment: int) -> RoundView | None:
        """The round open on ``fragment``, as this node tracks it while elected; None when it
        tracks none (not elected, or the fragment not loaded yet)."""
        view = self._views.get(fragment)
        if view is None:
            return None
        current = view.round
        return RoundView(
            base_version=current.base_version,
            seen=frozenset(current.seen),
            accepted=len(current.accepted),
            rejected=len(current.rejected),
            quorum_at=current.quorum_at,
            grace_s=current.grace_s,
        )

    def bulletin(self) -> RoundsBulletin:
        """What this node's syncer lease tells the learners (``store.bulletin``): the newest
        version of each fragment it tracks and the rounds with accepted contributions. Only
        meaningful while elected (the views are cleared otherwise)."""
        views, now = dict(self._views), self._clock()
        heads = tuple(views[f].version if f in views else UNKNOWN_HEAD for f in range(len(self.spec.fragments)))
        opened = {}
        for fragment, view in views.items():
            current = view.round
            if current.accepted:
                closes_at = None if current.quorum_at is None else current.quorum_at + current.grace_s
                closes_in = None if closes_at is None else max(0.0, closes_at - now)
                opened[fragment] = OpenRoundNote(current.base_version, len(current.accepted), closes_in)
        if not self.spread:
            return RoundsBulletin(heads, opened, live=len(self.training_learners()))
        watched = dict(self._watched)
        heads = tuple(watched[f].version if f in watched else head for f, head in enumerate(heads))
        for fragment, follow in watched.items():
            if follow.listed:
                opened[fragment] = OpenRoundNote(follow.version, follow.listed, None)
        return RoundsBulletin(heads, opened, live=len(self.training_learners()), assign=self._assign or None)

    def _syncer_lease_read(self, found: LeaseRead | None) -> None:
        """The election watch read the syncer lease: in a spread run, note the assignment in it
        (a live lease's: an expired one's is taken over, not followed); then hand it on."""
        if self.spread and found is not None and found.lease is not None and not found.lease.released:
            bulletin = RoundsBulletin.from_lease(found.lease, len(self.spec.fragments))
            assign = bulletin.assign if bulletin is not None else None
            # a coordinator that has not assigned yet (just elected): its assignment follows
            # within a poll or two (it announces at once), so watch at poll pace until it shows
            self._assignment_pending = assign is None and found.lease.holder != self.node_id
            if assign is not None:
                self._read_assign = (assign, self._clock())
                if self.node_id in assign:
                    self._loop.wake()
        if self._on_syncer_lease is not None:
            self._on_syncer_lease(found)

    def _follow_others(self, mine: frozenset[int]) -> None:
        """The elected node of a spread run follows the fragments others close, for its bulletin:
        each full pass, a forward HEAD probe for a newer version and one LIST of the contributions
        on the newest (what learners join and wait for). News renews the lease soon."""
        for fragment in range(len(self.spec.fragments)):
            if fragment in mine:
                self._watched.pop(fragment, None)
                continue
            watched = self._watched.get(fragment)
            try:
                newest = self.store.newest_version(fragment, known=watched.version if watched is not None else None)
                if newest is None:
                    continue
                listed = len(self.store.contributors(fragment, newest))
            except GradientMailError as exc:
                self._fragment_failures[fragment].failed(str(exc))
                continue
            if watched is None or (newest, bool(listed)) != (watched.version, bool(watched.listed)):
                self._announce()
            self._watched[fragment] = WatchedFragment(newest, listed)

    def _announce(self, *, at_once: bool = False) -> None:
        """The bulletin changed (a commit, a round opened or reached quorum): renew the lease soon
        (``at_once``: whatever the announce gap)."""
        self.election.announce(at_once=at_once)
        self._election_loop.wake()

    def grace_estimator(self, fragment: int) -> GraceEstimator:
        """The adaptive grace window of ``fragment`` (what it learned of step times and syncs)."""
        return self._grace[fragment]

    def committed(self) -> dict[int, RoundRecord]:
        """The newest committed round record of each fragment, as this node tracks it while elected."""
        return {fragment: view.record for fragment, view in list(self._views.items())}

    def learner_lease_ages(self) -> dict[str, float]:
        """Seconds since each live learner's lease last changed, on this node's clock (for telemetry)."""
        return {learner: self._observer.unchanged_for(LeaseName.of_learner(learner)) for learner in dict(self.live)}

    # -- learners' leases ----------------------------------------------------------
    def _read_leases(self) -> None:
        """Read the learners' leases (one LIST and a GET of each but this node's own learner's, which
        it knows): who is live, and when their next contributions are due (``due_in_s``, a hint:
        it only sets the pace of the listing)."""
        now = self._pacing.leases_read_at = self._clock()  # before the read: a failed one waits its turn
        self.live = live_learners(self.store, self._observer, own=self._own_lease(), on_expired=self._lease_expired)
        self._pacing.expect(now, self.live.values())
        if self.spread and self.election.is_leader:
            dead = self.election.expired_holder(within_s=self.election.ttl_s)
            nodes = closers(self.live, self.node_id, [dead] if dead else [])
            assign = assign_fragments(self._fragment_bytes, nodes)
            if assign != self._assign:
                log.info("node %s assigns the fragments' rounds: %s", self.node_id, ", ".join(assign))
                before = self._assign or (self._read_assign[0] if self._read_assign is not None else ())
                orphans = {f for f in orphaned(before, assign, nodes) if assign[f] != self.node_id}
                handover = now + self._pacing.idle_interval_s + 2 * self._pacing.poll_interval_s
                self._interim.update(dict.fromkeys(orphans, handover))
                first, self._assign = not self._assign, assign
                # a term's first assignment, or one that orphaned fragments: the others wait on it
                self._announce(at_once=first or bool(orphans))

    def _leases_in(self, now: float) -> float:
        """Seconds until the elected node should read the learners' leases again (whether every
        live learner is in decides a round waiting for quorum, so it reads them at poll pace)."""
        waiting = any(view.round.accepted and view.round.quorum_at is None for view in self._views.values())
        if not self.election.is_leader and not any(view.round.accepted for view in self._views.values()):
            return math.inf  # a spread run's closer reads them for its rounds only (the elected node: always)
        ttl_s = self._observer.ttl_s
        expiries = (ttl_s - self._observer.unchanged_for(LeaseName.of_learner(learner)) for learner in self.live)
        return self._pacing.leases_in(now, waiting=waiting, expiries_s=expiries)

    def _lease_expired(self, learner: str, found: LeaseRead) -> None:
        """Count a learner lease judged expired unreleased, once per version of it (a lease seen
        live that stopped, or one already dead at this node's first read after its election)."""
        if self._expired_tokens.get(learner) != found.token:
            self._expired_tokens[learner] = found.token
            self.learner_leases_expired += 1

    # -- one fragment's round ------------------------------------------------------
    def advance(self, fragment: int) -> None:
        """Take ``fragment``'s round as far as it goes now: find the newest version, collect,
        and close the round once quorum and grace allow. What a rounds pass does per fragment;
        it does not check the election itself (a commit does: it needs the lease held)."""
        view = self._views.get(fragment)
        now = self._clock()
        # Our own commits move the view; another writer's (a lost race, a deposed holder) shows as
        # contributions on a newer base, else the head probe once per idle interval finds it.
        if self._pacing.probe_head(fragment, now, forced=view is None or view.round.lagging):
            newest = self.store.newest_version(fragment, known=view.version if view else None)
            if newest is None:
                return  # not initialised yet by the first learner
        else:
            assert view is not None
            newest = view.version
        if view is None or newest > view.version:
            self._activity = True
            try:
                committed = self.store.load_version(self.spec, fragment, newest)
            except InvalidRecord:
                removed = self.store.remove_unreadable_round(fragment, newest)
                if removed is None:
                    raise
                self.forged_rounds_removed += 1
                log.warning(
                    "fragment %d: deleted the round record at version %d, which no node wrote: %s", fragment, newest, removed
                )
                return
            except (KeyNotFound, CorruptPayload) as exc:  # a blob of it is gone or damaged: replay puts it back
                restored = restore_version(self.store, self.backend, self.spec, fragment, newest)
                if not restored:
                    raise
                self.blobs_restored += len(restored)
                log.warning("fragment %d version %d: %s; restored %s by replaying its round", fragment, newest, exc, restored)
                return
            view = FragmentView(
                newest,
                committed.record,
                load_base(self.backend, committed),
                OpenRound(newest, opened_at=self._clock()),
                committed.record_sha256,
            )
            self._views[fragment] = view
            self._announce()  # a version the bulletin did not show yet
            self._seed_history(fragment, committed.record)
            self._anchor_bounds(fragment, view.base)
        self._collect(fragment, view)
        current = view.round
        if not current.accepted:
            return
        if not current.hurried:  # a round is due: more contributions, or its close, come soon
            current.hurried = True
            self._loop.hurry()
        now = self._clock()
        everyone = self.training_learners() <= current.learners
        if everyone and self._pacing.live_set_older_than_a_poll(now):
            # the live set is read once per idle interval: never close a round early on "every
            # live learner is in", nor skip its grace window, on a view older than a poll
            self._read_leases()
            everyone = self.training_learners() <= current.learners
        if current.quorum_at is None:
            if len(current.accepted) < self.spec.algorithm.quorum_size and not everyone:
                return
            current.quorum_at = now
            current.accepted_at_quorum = len(current.accepted)
            grace = self._grace[fragment]
            grace.observe_step_times(a.contribution.step_time_s for a in current.accepted)
            current.grace_s = 0.0 if everyone else grace.window(now - (current.first_seen_at or now))
            self._announce()  # when it closes: learners awaiting its commit look then
        if not everyone and now < current.quorum_at + current.grace_s:
            self._loop.pause_at_most(current.quorum_at + current.grace_s - now)
            return
        self._close(fragment, view)

    def _anchor_bounds(self, fragment: int, base: Base) -> None:
        """Tell the fragment's bounds the norm and size of the parameters the next round merges onto."""
        squares = sum(self.backend.finite_norm(tensor) ** 2 for tensor in base.params.values())
        elements = sum(math.prod(self.backend.shape(tensor)) for tensor in base.params.values())
        self._history[fragment].anchor(math.sqrt(squares), elements)

    def _seed_history(self, fragment: int, newest: RoundRecord) -> None:
        """Learn the bounds' history from committed rounds we did not close: the newest one, and
        when the history is short (a new term), the ones before it, up to ``SEED_ROUNDS``."""
        history = self._history[fragment]
        known = bool(history.rounds)  # we saw the rounds before: this one follows them
        if not history.seed(newest.participants) and not known:
            log.warning("fragment %d: round record %d lists more participants than a round holds", fragment, newest.version)
        version = newest.version - 1
        while not known and version > newest.version - SEED_ROUNDS and version > 0:
            try:
                history.seed(self.store.read_round(fragment, version).participants, older=True)
            except (KeyNotFound, InvalidRecord):
                return
            version -= 1

    def _collect(self, fragment: int, view: FragmentView) -> None:
        """Accept or reject each new contribution, in the order listed. The fetches (record,
        payload, sha256, decode) run up to ``PREFETCH`` ahead on threads of their own while the
        calling thread checks the one before (finite, norm, duplicates): the outcomes, and their
        order, are those of one contribution at a time."""
        current = view.round
        steps: list[keys.ContributionKey] = []  # to validate, in the order listed
        for key in self.store.contributions(fragment):
            if key.record in current.seen:
                continue
            if key.base_version > view.version:
                current.lagging = self._activity = True  # our view lags; the next pass reloads
                continue
            self._activity = True
            if key.base_version < view.version and not self._mergeable_late(fragment, key, view):
                current.seen.add(key.record)
                self._old_contribution(fragment, key, view)
                continue
            steps.append(key)
        steps = self._within_budget(current, steps, regulars={p.learner for p in view.record.participants})
        if not steps:
            return
        started = self._clock()
        norm_limit = self._history[fragment].norm_limit
        pending: deque[Future[Fetched | Rejection]] = deque()
        ahead = iter(steps)
        with ThreadPoolExecutor(max_workers=PREFETCH, thread_name_prefix=f"gm-fetch-{self.node_id}") as pool:
            try:
                for key in steps:
                    while len(pending) < PREFETCH:  # keep the next ones coming while this one is checked
                        upcoming = next(ahead, None)
                        if upcoming is None:
                            break
                        with self._notified_lock:
                            handed = self._handed.pop(upcoming.record, None)
                        pending.append(pool.submit(fetch_contribution, self.store, self.spec, view.version, upcoming, handed))
                    fetched = pending.popleft().result()
                    current.seen.add(key.record)
                    self._judge(current, key, check_fetched(self.backend, fetched, norm_limit))
                    del fetched
            finally:
                for future in pending:  # a retryable mailbox error escaped: the rest are read next pass
                    future.cancel()
        current.fetch_s += self._clock() - started

    def _within_budget(
        self, current: OpenRound, steps: list[keys.ContributionKey], *, regulars: set[str]
    ) -> list[keys.ContributionKey]:
        """The new contributions this pass examines, in this order (each in listed order): the
        ``regulars`` (participants of the round before), then learners with a live lease, then
        at most ``STRANGERS_PER_PASS`` of the others; up to ``ROUND_CONTRIBUTION_LIMIT`` in the
        round, past which they are rejected ``flood`` without a read. Strangers left for a later
        pass are not waited for: the round closes by its rule, and they are judged stale by
        name afterwards."""
        first = [key for key in steps if key.learner in regulars]
        live = [key for key in steps if key.learner not in regulars and key.learner in self.live]
        strangers = [key for key in steps if key.learner not in regulars and key.learner not in self.live]
        steps = first + live + strangers[:STRANGERS_PER_PASS]
        room = ROUND_CONTRIBUTION_LIMIT - current.examined
        if len(steps) <= room:
            current.examined += len(steps)
            return steps
        chosen, refused = steps[: max(0, room)], steps[max(0, room) :]
        current.examined += len(chosen)
        for key in refused:
            current.seen.add(key.record)
            current.rejected.append(
                Rejection(
                    learner=key.learner,
                    contribution=key.record,
                    reason="flood",
                    detail=f"past the {ROUND_CONTRIBUTION_LIMIT} contributions a round examines",
                )
            )
        chosen_records = {key.record for key in chosen}
        return [key for key in steps if key.record in chosen_records]

    def _judge(self, current: OpenRound, key: keys.ContributionKey, outcome: Accepted | Rejection) -> None:
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
            if current.summed is None and not current.accepted:
                current.summed = round_sum(self.backend, self.spec)
            if current.summed is not None:  # merged now, while the next contributions are fetched
                current.summed.add(outcome.delta, outcome.weight, outcome.tensor_norms)
            current.accepted.append(outcome)
            if len(current.accepted) in (1, self.spec.algorithm.quorum_size - 1):
                self._announce()  # a round opened, or one short of quorum: learners may join it
            current.last_seen_at = self._clock()
            if current.first_seen_at is None:
                current.first_seen_at = current.last_seen_at
            quorum_at = current.quorum_at
            self._grace[key.fragment].observe_lateness(0.0 if quorum_at is None else current.last_seen_at - quorum_at)

    def _mergeable_late(self, fragment: int, key: keys.ContributionKey, view: FragmentView) -> bool:
        """A contribution based on an older version that ``max_staleness`` lets into this round:
        within the bound, and in no round record yet (neither merged nor rejected)."""
        if view.version - key.base_version > self.spec.algorithm.max_staleness:
            return False
        return not any(key.record in self._keys_listed_by(fragment, v) for v in range(key.base_version + 1, view.version + 1))

    def _old_contribution(self, fragment: int, key: keys.ContributionKey, view: FragmentView) -> None:
        """A contribution against an older version: kept for audit once a round lists it (retention
        collects it when the round leaves the audit window), else stale — once: a round this node
        committed that rejected it stale (listed or only counted) is not repeated."""
        last_round = key.base_version + 1 + self.spec.algorithm.max_staleness  # the last round that could list it
        if (fragment, key.record) in self._judged_stale or any(
            key.record in self._keys_listed_by(fragment, v)
            for v in range(key.base_version + 1, min(last_round, view.version) + 1)
        ):
            return
        view.round.rejected.append(
            Rejection(
                learner=key.learner,
                contribution=key.record,
                reason="stale",
                detail=f"based on version {key.base_version}, current is {view.version}",
            )
        )
        closed_quorum_at = self._quorum_at.get((fragment, key.base_version))
        if closed_quorum_at is not None:  # it came after its round closed: how much later
            self._grace[fragment].observe_lateness(self._clock() - closed_quorum_at)

    def _keys_listed_by(self, fragment: int, version: int) -> frozenset[str]:
        cached = self._referenced.get((fragment, version))
        if cached is None:
            try:
                record = self.store.read_round(fragment, version)
            except (KeyNotFound, InvalidRecord):
                return frozenset()
            cached = frozenset([p.contribution for p in record.participants] + [r.contribution for r in record.rejected])
            self._referenced[(fragment, version)] = cached
        return cached

    def _close(self, fragment: int, view: FragmentView) -> None:
        """Close the round with ``close_round`` and commit its draft, unless our view lags or
        the lease may run out meanwhile (then the round stays open for whoever commits it)."""
        current = view.round
        started = self._clock()
        cap = self._history[fragment].samples_per_step_cap(
            (a.contribution.steps, a.contribution.samples) for a in current.accepted
        )
        draft = close_round(self.backend, self.spec, view.base, current.accepted, cap, clock=self._clock, summed=current.summed)
        if draft.non_finite:
            current.summed = None  # it holds a dropped delta: the next close sums afresh
        for rejection in draft.non_finite:
            current.accepted = [a for a in current.accepted if a.key.record != rejection.contribution]
            current.rejected.append(rejection)
            log.warning("fragment %d: a merge was not finite; retrying without %s", fragment, rejection.contribution)
        if isinstance(draft, AbandonedRound):
            current.quorum_at = None  # start the round over with whatever arrives next
            return
        head = self.store.read_head(fragment)
        if head is not None and head.version > view.version:
            if self.store.round_exists(fragment, head.version):  # our view lags (retention may hide the records between)
                log.info(
                    "node %s: fragment %d is at version %d, not %d; reloading", self.node_id, fragment, head.version, view.version
                )
                del self._views[fragment]
                return
            if (fragment, head.version) not in self._ghost_heads:  # its record is gone: reloading would find ours again
                self._ghost_heads.add((fragment, head.version))
                log.warning(
                    "fragment %d: the head names version %d, whose record is gone (deleted?); committing on from version %d",
                    fragment,
                    head.version,
                    view.version,
                )
        if not self.spread and not self.election.holds_for(self.spec.lease_ttl_s / 3):
            return  # renewals are failing: leave the commit to whoever holds the lease next
        if fragment not in self.assigned():
            return  # the fragment went to another node meanwhile (spread), or our term ended
        version_draft = self._version_draft(fragment, view, draft, started)
        stored = self.store.commit_version(version_draft, committed_by=self.node_id, term=self.election.term)
        committed_at = self._clock()
        if stored is None:
            self.lost_races += 1
            log.info("node %s lost the race for fragment %d version %d", self.node_id, fragment, view.version + 1)
            del self._views[fragment]
            return
        self._committed(fragment, view, draft, stored, started, committed_at, version_draft.params)

    def _version_draft(self, fragment: int, view: FragmentView, draft: RoundDraft, started: float) -> VersionDraft:
        """The round's draft as the store commits it: with the round's rejections and timings,
        and the previous record's digest."""
        current = view.round
        codec = self.spec.algorithm.update_codec
        return VersionDraft(
            fragment,
            view.version + 1,
            {name: self.backend.to_numpy(tensor) for name, tensor in draft.params.items()},
            {name: self.backend.to_numpy(tensor) for name, tensor in draft.state.to_tensors().items()},
            self.spec.algorithm,
            base_version=view.version,
            participants=draft.participant_records(),
            rejected=tuple(current.rejected),
            final=draft.final,
            timing=RoundTiming(
                quorum_wait_s=(current.quorum_at or started) - (current.first_seen_at or started),
                grace_s=current.grace_s,
                sync_s=current.fetch_s + self._clock() - started,
                arrival_spread_s=(current.last_seen_at or started) - (current.first_seen_at or started),
            ),
            previous=view.record_sha256 or None,
            samples_per_step_cap=draft.samples_per_step_cap,
            backend=self.backend.name,
            update=(codec, draft.update) if codec is not None and draft.update is not None else None,
            outer_momentum=draft.momentum,
        )

    def _committed(
        self,
        fragment: int,
        view: FragmentView,
        draft: RoundDraft,
        stored: StoredRound,
        started: float,
        committed_at: float,
        params: Mapping[str, np.ndarray],
    ) -> None:
        """After our commit: learn from the round, drop the stale contributions it rejected,
        open the next round, announce the commit, then apply retention."""
        current = view.round
        record = stored.record
        log.info(
            "node %s committed fragment %d version %d (%d merged, %d rejected) quorum wait %.2fs grace %.2fs sync %.2fs",
            self.node_id,
            fragment,
            record.version,
            len(record.participants),
            len(current.rejected),
            record.timing.quorum_wait_s,
            record.timing.grace_s,
            record.timing.sync_s,
        )
        self._grace[fragment].observe_sync(current.fetch_s + self._clock() - started)
        if current.quorum_at is not None:
            self._quorum_at[(fragment, view.version)] = current.quorum_at
            for closed in [k for k in self._quorum_at if k[0] == fragment and k[1] < view.version - QUORUM_TIMES_KEPT]:
                del self._quorum_at[closed]
        self._history[fragment].record([(a.contribution.steps, a.contribution.samples, a.norm) for a in draft.participants])
        self.commits += 1
        self._referenced[(fragment, record.version)] = frozenset(
            [p.contribution for p in record.participants] + [r.contribution for r in current.rejected]
        )
        self._retention.committed(record)
        stale = [keys.parse_contribution_record(r.contribution) for r in current.rejected if r.reason == "stale"]
        self._judged_stale.update((fragment, k.record) for k in stale if k is not None)
        known = set(self.live) | {p.learner for p in record.participants}
        ours = [k for k in stale if k is not None and k.learner in known]  # strangers' floods: retention's
        for stale_key in ours[:STALE_DELETES_PER_COMMIT]:
            self.store.delete_contribution(stale_key)
        next_round = OpenRound(record.version, opened_at=committed_at)
        self._views[fragment] = FragmentView(record.version, record, Base(draft.params, draft.state), next_round, stored.sha256)
        self._anchor_bounds(fragment, self._views[fragment].base)
        self._activity = True
        self._announce()
        if self._on_commit is not None:  # the learner here takes the committed bytes as they are, unread
            copies = {name: np.array(array, copy=True) for name, array in params.items()}
            self._on_commit(CommittedVersion(record, copies, {}, stored.sha256))
        with self._notified_lock:  # what its round did not take is stale now
            self._handed = {
                k: h for k, h in self._handed.items() if h.key.fragment != fragment or h.key.base_version >= record.version
            }
        telemetry.round_committed(
            self,
            fragment,
            record,
            telemetry.RoundPhases(
                opened_at=current.opened_at,
                first_seen_at=current.first_seen_at or started,
                quorum_at=current.quorum_at or started,
                closing_at=started,
                merged_at=draft.merged_at,
                stepped_at=draft.stepped_at,
                committed_at=committed_at,
                now=self._clock(),
                grace_window_s=current.grace_s,
                grace_contributions=len(current.accepted) - current.accepted_at_quorum,
                fetch_s=current.fetch_s,
                fetched_bytes=sum(a.contribution.payload.wire_bytes for a in current.accepted),
            ),
        )
        self._retention.apply(fragment, record.version)
        oldest_base = self.spec.retention.oldest_kept_base(record.version, self.spec.algorithm.max_staleness)
        for key in [k for k in self._referenced if k[0] == fragment and k[1] < oldest_base]:
            del self._referenced[key]  # no contribution based below it is left to check
        for judged in [j for j in self._judged_stale if j[0] == fragment and _base_of(j[1]) < oldest_base]:
            self._judged_stale.discard(judged)  # retention deletes those


def _base_of(record_key: str) -> int:
    """The base version a contribution record key names (-1 if it names none)."""
    parsed = keys.parse_contribution_record(record_key)
    return parsed.base_version if parsed is not None else -1
