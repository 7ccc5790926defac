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
import time
from collections.abc import Callable, Mapping
from contextlib import closing

import numpy as np

from gradientmail.backends import Backend
from gradientmail.errors import GradientMailError, InvalidRecord, KeyNotFound
from gradientmail.polling import PollingLoop, RepeatedFailures, idle_interval
from gradientmail.records import Lease, Rejection, RoundRecord, keys
from gradientmail.store import (
    CommittedVersion,
    LeaseObserver,
    LeaseRead,
    RetentionSweep,
    RoundsBulletin,
    RunSpec,
    RunStore,
    StoredRound,
)
from gradientmail.store.store_clock import StoreClock
from gradientmail.syncer.election import Election
from gradientmail.syncer.grace import GraceEstimator
from gradientmail.syncer.handed import HandedContributions
from gradientmail.syncer.live_set import LiveLearners
from gradientmail.syncer.pacing import HEAD_PROBE_TTLS, SyncerPacing
from gradientmail.syncer.prefetch import fetched_in_order
from gradientmail.syncer.repair import Repaired, load_or_repair
from gradientmail.syncer.round_state import FragmentRounds, FragmentView, OpenRound, RecordReader, RoundView
from gradientmail.syncer.rounds import (
    AbandonedRound,
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
from gradientmail.syncer.spread import SpreadLayout, follow_others
from gradientmail.telemetry import hooks as telemetry

__all__ = ["RoundView", "SyncerRuntime"]

log = logging.getLogger(__name__)

PREFETCH = 2
"""Contributions fetched (record, payload, digest, decode) at once, ahead of the one being
checked: enough to keep the transfers going while the syncer checks one, and bounded, so the
syncer holds at most this many payloads beyond the ones it accepted."""
STALE_DELETES_PER_COMMIT = 64
"""Stale contributions a commit deletes at once, one request each; a flood's thousands are left
to retention, which deletes contributions once their base ages out of the audit window."""


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
        algorithm = spec.algorithm
        fragments = range(len(spec.fragments))
        self.spread = (
            SpreadLayout([spec.fragment_bytes(f) for f in fragments], node_id, ttl_s)
            if algorithm.syncer_layout == "spread"
            else None
        )
        """A spread run's assignment as this node knows it (None: one node closes every round)."""
        self.learners = LiveLearners(store, LeaseObserver(ttl_s, clock, store_clock), own_lease or (lambda: None))
        """The learners' leases as this node read them last (only while it closes rounds)."""
        self.rounds = [
            FragmentRounds(
                f, algorithm, margin_s=poll_interval_s, failures=RepeatedFailures(log, f"node {node_id}: fragment {f}", clock)
            )
            for f in fragments
        ]
        """Each fragment's rounds as this node holds them (``syncer.round_state``)."""
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
        self._watch_every = watch_every or (lambda: None)
        """How often to watch the syncer lease while this node's learner awaits a commit (None: idle pace)."""
        self._handed = HandedContributions()
        """What this node's learner published, handed in memory; its lock guards each ``notified``."""
        self.commits = 0
        self.forged_rounds_removed = 0
        """Unreadable newest round records this node deleted (``RunStore.remove_unreadable_round``)."""
        self.blobs_restored = 0
        """Blobs of a loaded version this node rewrote by replay (``syncer.repair``)."""
        self.lost_races = 0

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

    @property
    def live(self) -> dict[str, Lease]:
        """Learner → its live lease, as this node read them last (empty while it closes no round)."""
        return self.learners.leases

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
        pending = self.spread is not None and self.spread.pending
        due = self._pacing.election_due(
            now,
            holder=election.is_leader,
            lease_age_s=election.lease_age(),
            ttl_s=election.ttl_s,
            watch_every_s=self._pacing.poll_interval_s if pending else self._watch_every(),
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
        run, those the assignment gives it (``SpreadLayout.mine``)."""
        leader = self.election.is_leader
        if self.spread is not None:
            return self.spread.mine(self._clock(), leader=leader)
        return frozenset(range(len(self.rounds))) if leader else frozenset()

    def rounds_pass(self) -> None:
        """The rounds thread's pass, at its pace: over the fragments this node closes
        (``assigned``), a full pass when due, else over those with a round pending or announced;
        then the next pause. In a spread run the elected node also follows the other fragments
        for its bulletin. With nothing to close: forget the rounds (a future term or assignment
        recovers from the mailbox)."""
        now = self._clock()
        with self._handed.lock:
            notified = {r.fragment for r in self.rounds if r.take_notified()}
        pacing, spread = self._pacing, self.spread
        leader = self.election.is_leader
        if spread is not None and not leader:
            spread.stand_down()
        if leader and spread is not None and pacing.leases_due(self._leases_in(now)):
            self._read_leases()  # the assignment follows the live set
        mine = self.assigned()
        for rounds in self.rounds:
            if rounds.fragment not in mine:
                rounds.forget()  # not ours (now): a future term or assignment recovers from the mailbox
        if not mine and not leader:
            self._handed.clear()
            self.learners.clear()  # only nodes that close rounds watch the learners' leases
            pacing.stand_down()
            self._loop.settle()
            return
        if pacing.leases_due(self._leases_in(now)):
            self._read_leases()
        full = pacing.start_pass(now)
        pending = {r.fragment for r in self.rounds if r.pending}
        fragments = sorted(mine) if full else sorted((notified | pending) & mine)
        self._activity = bool(notified)
        if leader and spread is not None and full and follow_others(spread, self.store, mine, [r.failures for r in self.rounds]):
            self._announce()
        for fragment in fragments:
            if self._loop.stopping or fragment not in self.assigned():
                return
            try:  # one fragment that cannot advance (an object it cannot read) holds up no other
                self.advance(fragment)
            except GradientMailError as exc:
                self.rounds[fragment].failures.failed(str(exc))
            else:
                self.rounds[fragment].failures.recovered()
        busy = any(r.pending for r in self.rounds)
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
        mine = handed is not None and fragment in self.assigned()
        with self._handed.lock:
            self.rounds[fragment].notified = True
            if handed is not None and mine:
                self._handed.offer(handed)
        self._loop.hurry()

    # -- what a round looks like ---------------------------------------------------
    def open_round(self, fragment: int) -> RoundView | None:
        """The round open on ``fragment``, as this node tracks it while elected; None when it
        tracks none (not elected, or the fragment not loaded yet)."""
        return self.rounds[fragment].round_view()

    def bulletin(self) -> RoundsBulletin:
        """What this node's syncer lease tells the learners (``store.bulletin``): the newest
        version of each fragment it tracks and the rounds with accepted contributions. Only
        meaningful while elected (the views are cleared otherwise)."""
        now = self._clock()
        heads = tuple(r.head for r in self.rounds)
        opened = {r.fragment: note for r in self.rounds if (note := r.note(now)) is not None}
        live = len(self.learners.training())
        if self.spread is None:
            return RoundsBulletin(heads, opened, live=live)
        return self.spread.bulletin(heads, opened, live)

    def _syncer_lease_read(self, found: LeaseRead | None) -> None:
        """The election watch read the syncer lease: in a spread run, note the assignment in it
        (a live lease's: an expired one's is taken over, not followed); then hand it on."""
        spread, lease = self.spread, found.lease if found is not None else None
        if (
            spread is not None
            and lease is not None
            and not lease.released
            and spread.lease_read(lease, len(self.rounds), self._clock())
        ):
            self._loop.wake()
        if self._on_syncer_lease is not None:
            self._on_syncer_lease(found)

    def _announce(self, *, at_once: bool = False) -> None:
        """The bulletin changed (a commit, a round opened or reached quorum): renew the lease soon
        (``at_once``: whatever the announce gap)."""
        self.election.announce(at_once=at_once)
        self._election_loop.wake()

    def grace_estimator(self, fragment: int) -> GraceEstimator:
        """The adaptive grace window of ``fragment`` (what it learned of step times and syncs)."""
        return self.rounds[fragment].grace

    def committed(self) -> dict[int, RoundRecord]:
        """The newest committed round record of each fragment, as this node tracks it while elected."""
        return {r.fragment: view.record for r in self.rounds if (view := r.view) is not None}

    # -- learners' leases ----------------------------------------------------------
    def _read_leases(self) -> None:
        """Read the learners' leases (one LIST and a GET of each but this node's own learner's, which
        it knows): who is live, and when their next contributions are due (``due_in_s``, a hint:
        it only sets the pace of the listing). The coordinator of a spread run reassigns."""
        now = self._pacing.leases_read_at = self._clock()  # before the read: a failed one waits its turn
        self.learners.read()
        self._pacing.expect(now, self.live.values())
        if self.spread is not None and self.election.is_leader:
            dead = self.election.expired_holder(within_s=self.election.ttl_s)
            handover_s = self._pacing.idle_interval_s + 2 * self._pacing.poll_interval_s
            changed = self.spread.reassign(self.live, [dead] if dead else [], now, handover_s=handover_s)
            if changed is not None:
                log.info("node %s assigns the fragments' rounds: %s", self.node_id, ", ".join(changed.assign))
                self._announce(at_once=changed.at_once)

    def _leases_in(self, now: float) -> float:
        """Seconds until the elected node should read the learners' leases again (whether every
        live learner is in decides a round waiting for quorum, so it reads them at poll pace)."""
        waiting = any(r.waiting_for_quorum for r in self.rounds)
        if not self.election.is_leader and not any(r.pending for r in self.rounds):
            return float("inf")  # a spread run's closer reads them for its rounds only (the elected node: always)
        return self._pacing.leases_in(now, waiting=waiting, expiries_s=self.learners.expiries())

    # -- one fragment's round ------------------------------------------------------
    def advance(self, fragment: int) -> None:
        """Take ``fragment``'s round as far as it goes now: find the newest version, collect,
        and close the round once quorum and grace allow. What a rounds pass does per fragment;
        it does not check the election itself (a commit does: it needs the lease held)."""
        rounds = self.rounds[fragment]
        view = rounds.view
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
            loaded = load_or_repair(self.store, self.backend, self.spec, fragment, newest)
            if isinstance(loaded, Repaired):  # the next pass loads what is there now
                self.forged_rounds_removed += loaded.removed_round
                self.blobs_restored += len(loaded.restored)
                return
            base = load_base(self.backend, loaded)
            view = FragmentView(newest, loaded.record, base, OpenRound(newest, opened_at=self._clock()), loaded.record_sha256)
            rounds.open(view, self.backend)
            self._announce()  # a version the bulletin did not show yet
            if not rounds.seed_history(loaded.record, _reader(self.store, fragment)):
                log.warning("fragment %d: round record %d lists more participants than a round holds", fragment, newest)
        self._collect(rounds, view)
        current = view.round
        if not current.accepted:
            return
        if not current.hurried:  # a round is due: more contributions, or its close, come soon
            current.hurried = True
            self._loop.hurry()
        everyone = self.learners.training() <= current.learners
        if everyone and self._pacing.live_set_older_than_a_poll(self._clock()):
            # the live set is read once per idle interval: never close a round early on "every
            # live learner is in", nor skip its grace window, on a view older than a poll
            self._read_leases()
            everyone = self.learners.training() <= current.learners
        step = rounds.step(self._clock(), everyone=everyone)
        if step.announce:
            self._announce()  # when it closes: learners awaiting its commit look then
        if step.wait_s is not None:
            self._loop.pause_at_most(step.wait_s)
        if step.close:
            self._close(rounds, view)

    def _collect(self, rounds: FragmentRounds, view: FragmentView) -> None:
        """Accept or reject each new contribution, in the order listed. The fetches (record,
        payload, digest, decode) run up to ``PREFETCH`` ahead on threads of their own while the
        calling thread checks the one before (finite, norm, duplicates): the outcomes, and their
        order, are those of one contribution at a time."""
        current, read = view.round, _reader(self.store, rounds.fragment)
        steps: list[keys.ContributionKey] = []  # to validate, in the order listed
        for key in self.store.contributions(rounds.fragment):
            if key.record in current.seen:
                continue
            if key.base_version > view.version:
                current.lagging = self._activity = True  # our view lags; the next pass reloads
                continue
            self._activity = True
            if key.base_version < view.version and not rounds.mergeable_late(key, read):
                rounds.old_contribution(key, read, now=self._clock())
                continue
            steps.append(key)
        steps = rounds.within_budget(steps, self.live)
        if not steps:
            return
        started = self._clock()
        norm_limit = rounds.history.norm_limit

        def fetch(key: keys.ContributionKey) -> Fetched | Rejection:
            return fetch_contribution(self.store, self.spec, view.version, key, self._handed.take(key.record))

        with closing(fetched_in_order(steps, fetch, depth=PREFETCH, thread_name=f"gm-fetch-{self.node_id}")) as fetches:
            for key, fetched in fetches:
                current.seen.add(key.record)
                outcome = check_fetched(self.backend, fetched, norm_limit)
                del fetched
                if rounds.judge(key, outcome, now=self._clock(), new_sum=lambda: round_sum(self.backend, self.spec)):
                    self._announce()  # a round opened, or one short of quorum: learners may join it
        current.fetch_s += self._clock() - started

    def _close(self, rounds: FragmentRounds, view: FragmentView) -> None:
        """Close the round with ``close_round`` and commit its draft, unless our view lags or
        the lease may run out meanwhile (then the round stays open for whoever commits it)."""
        fragment, current = rounds.fragment, view.round
        started = self._clock()
        rounds.reject_round_outliers()  # never all: the round's median is not one
        current_counts = ((a.contribution.steps, a.contribution.samples) for a in current.accepted)
        cap = rounds.history.samples_per_step_cap(current_counts, signed=self.store.key is not None)
        draft = close_round(self.backend, self.spec, view.base, current.accepted, cap, clock=self._clock, summed=current.summed)
        rounds.not_finite(draft.non_finite)
        for rejection in draft.non_finite:
            log.warning("fragment %d: a merge was not finite; retrying without %s", fragment, rejection.contribution)
        if isinstance(draft, AbandonedRound):
            current.quorum_at = None  # start the round over with whatever arrives next
            return
        if _view_lags(self.store, rounds, view):
            rounds.forget()  # the next pass reloads
            return
        if self.spread is None and not self.election.holds_for(self.spec.lease_ttl_s / 3):
            return  # renewals are failing: leave the commit to whoever holds the lease next
        if fragment not in self.assigned():
            return  # the fragment went to another node meanwhile (spread), or our term ended
        version_draft = view.version_draft(draft, self.backend, self.spec.algorithm, current.timing(started, self._clock()))
        stored = self.store.commit_version(
            version_draft, committed_by=self.node_id, term=self.election.term, digest=self.spec.blob_digest
        )
        committed_at = self._clock()
        if stored is None:
            self.lost_races += 1
            log.info("node %s lost the race for fragment %d version %d", self.node_id, fragment, view.version + 1)
            rounds.forget()
            return
        self._committed(rounds, draft, stored, started, committed_at, version_draft.params)

    def _committed(
        self,
        rounds: FragmentRounds,
        draft: RoundDraft,
        stored: StoredRound,
        started: float,
        committed_at: float,
        params: Mapping[str, np.ndarray],
    ) -> None:
        """After our commit: learn from the round, drop the stale contributions it rejected,
        open the next round, announce the commit, then apply retention."""
        assert rounds.view is not None
        fragment, current, record = rounds.fragment, rounds.view.round, stored.record
        _log_commit(self.node_id, record, len(current.rejected))
        view = FragmentView(
            record.version,
            record,
            Base(draft.params, draft.state),
            OpenRound(record.version, opened_at=committed_at),
            stored.sha256,
        )
        stale = rounds.committed(view, draft, sync_s=current.fetch_s + self._clock() - started)
        self.commits += 1
        self._retention.committed(record)
        known = set(self.live) | {p.learner for p in record.participants}
        ours = [k for k in stale if k.learner in known]  # strangers' floods: retention's
        for stale_key in ours[:STALE_DELETES_PER_COMMIT]:
            self.store.delete_contribution(stale_key)
        rounds.open(view, self.backend)
        self._activity = True
        self._announce()
        if self._on_commit is not None:  # the learner here takes the committed bytes as they are, unread
            copies = {name: np.array(array, copy=True) for name, array in params.items()}
            self._on_commit(CommittedVersion(record, copies, {}, stored.sha256))
        self._handed.committed(fragment, record.version)
        telemetry.round_committed(self, fragment, record, current.phases(started, draft, committed_at, self._clock()))
        self._retention.apply(fragment, record.version)
        rounds.forget_below(self.spec.retention.oldest_kept_base(record.version, self.spec.algorithm.max_staleness))


def _reader(store: RunStore, fragment: int) -> RecordReader:
    """The round records of ``fragment`` as the rules read them (None: gone or unreadable)."""

    def read(version: int) -> RoundRecord | None:
        try:
            return store.read_round(fragment, version)
        except (KeyNotFound, InvalidRecord):
            return None

    return read


def _view_lags(store: RunStore, rounds: FragmentRounds, view: FragmentView) -> bool:
    """Whether the head names a version newer than ``view`` whose record exists (retention may
    hide the records between): then reload. One whose record is gone is reported (once) and
    committed on: reloading would find ours again."""
    fragment = rounds.fragment
    head = store.read_head(fragment)
    if head is None or head.version <= view.version:
        return False
    if store.round_exists(fragment, head.version):
        log.info("fragment %d is at version %d, not %d; reloading", fragment, head.version, view.version)
        return True
    if rounds.first_ghost(head.version):
        log.warning(
            "fragment %d: the head names version %d, whose record is gone (deleted?); committing on from version %d",
            fragment,
            head.version,
            view.version,
        )
    return False


def _log_commit(node_id: str, record: RoundRecord, rejected: int) -> None:
    timing = record.timing
    log.info(
        "node %s committed fragment %d version %d (%d merged, %d rejected) quorum wait %.2fs grace %.2fs sync %.2fs",
        node_id, record.fragment, record.version, len(record.participants), rejected,
        timing.quorum_wait_s, timing.grace_s, timing.sync_s,
    )  # fmt: skip
