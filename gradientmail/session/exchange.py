"""The learner's background exchange: publish contributions, fetch commits, renew the lease.

Transfers run on one polling loop and the lease on another, so a slow upload never delays a
renewal. Both touch only NumPy arrays and the store, never the model: the training thread
hands a snapshot of the fragment's parameters already copied to host memory (one copy, into
a reused :class:`~gradientmail.backends.host.HostBuffer`), and this thread computes the delta
(``align.pseudo_gradient``), encodes, hashes and uploads it. For a fetched commit it decides,
once, whether the commit merged our contribution (``align.contribution_merged``) and, when
the learner carries unmerged work, computes the correction θ_commit − θ_start
(``align.carry_correction``) that alignment adds to the live parameters, so the training
thread only writes. Each fragment's state is its :class:`LearnerFragment`.

Polling (docs/session.md, "Polling"; the rules are ``session.looking``): after an upload the
loop hurries (short pauses that back off to ``poll_interval_s`` within a bound) and probes the
fragments awaiting a commit, one HEAD each. The other fragments are looked at once per look
interval, a tenth of the sync period (the idle interval while not training): a look follows the
elected syncer's bulletin (``store.bulletin``: heads and open rounds, one GET of the syncer
lease, or none when this node's election watch just read it or this node holds it) and probes
only the fragments it says moved. Without a bulletin to follow, a look probes every fragment
and lists the contributions on its version (rounds others opened). A fragment about to be due
is probed once just before its publish. ``commit_available()`` (the syncer in the same
process) runs the next pass at once.
"""

from __future__ import annotations

import collections
import logging
import queue
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from gradientmail.algorithms import align
from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.errors import DuplicateLearner, GradientMailError, KeyNotFound
from gradientmail.polling import PollingLoop, idle_interval
from gradientmail.records import Lease, RoundRecord, SavedState
from gradientmail.session.commit_reader import CommitReader
from gradientmail.session.feedback import encode_delta, settle_residual
from gradientmail.session.fragment import Commit, LearnerFragment, Publication
from gradientmail.session.looking import FragmentSeen, LearnerLooking, LearnerSchedule, Look
from gradientmail.session.transfer_meter import TransferMeter
from gradientmail.store import CommittedVersion, LearnerLease, LeaseRead, RoundsBulletin, RunSpec, RunStore
from gradientmail.store.store_clock import StoreClock
from gradientmail.syncer.rounds import Handed

__all__ = ["Exchange"]

log = logging.getLogger(__name__)

_LATENCIES_KEPT = 1000
_NO_SCHEDULE = LearnerSchedule()


def _read_only(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for array in arrays.values():
        array.setflags(write=False)
    return arrays


def _writable(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Arrays a framework can wrap without copying (decoded payloads are read-only views)."""
    return {name: a if a.flags.writeable else a.copy() for name, a in params.items()}


class Exchange:
    """Background worker for one learner, over the learner's ``fragments`` (shared with the
    training thread). ``on_change`` is called when a commit is ready, ``on_published`` with the
    fragment after each upload. ``algorithm`` is the learner's own (its ``carry_unmerged``,
    ``overlap_steps`` and ``error_feedback``), the run's when None.

    ``lease_info`` says what the learner's lease tells observers; it is called at each
    renewal (on the lease thread), never per step. ``schedule`` says where the training thread's
    schedule is (``session.looking.LearnerSchedule``), read once per pass; ``own_bulletin``
    gives this node's syncer bulletin while it holds the election (None otherwise), and
    :meth:`note_syncer_lease` takes the syncer lease whenever this node's election watch reads it.

    Public passes (what the threads run, and what tests drive on a fake clock):
    :meth:`exchange_pass` and :meth:`renew_lease`, on :attr:`loop` and :attr:`lease_loop`.
    """

    def __init__(
        self,
        store: RunStore,
        spec: RunSpec,
        learner_id: str,
        fragments: Sequence[LearnerFragment],
        *,
        lease_ttl_s: float,
        poll_interval_s: float,
        on_change: Callable[[], None],
        lease_info: Callable[[], dict[str, object]],
        clock: Callable[[], float],
        idle_interval_s: float | None = None,
        on_published: Callable[[int, Handed | None], None] | None = None,
        algorithm: DiLoCo | None = None,
        schedule: Callable[[], LearnerSchedule] | None = None,
        own_bulletin: Callable[[], RoundsBulletin | None] | None = None,
        store_clock: StoreClock | None = None,
        saved_state: Callable[[], SavedState | None] | None = None,
    ) -> None:
        self._store = store
        self._spec = spec
        self._learner = learner_id
        self._fragments = list(fragments)
        self._lease = LearnerLease(store, learner_id, lease_ttl_s, clock=clock, store_clock=store_clock)
        self._lease_info = lease_info
        self._lease_loop = PollingLoop(f"gm-lease-{learner_id}", self.renew_lease, lease_ttl_s / 3)
        self._clock = clock
        self._on_change = on_change
        self._outbox: queue.Queue[Publication] = queue.Queue()
        self._poll_interval_s = poll_interval_s
        self._idle_interval_s = idle_interval(poll_interval_s, lease_ttl_s, idle_interval_s)
        self._loop = PollingLoop(f"gm-exchange-{learner_id}", self.exchange_pass, self._idle_interval_s)
        self.looking = LearnerLooking(
            len(self._fragments),
            poll_interval_s=poll_interval_s,
            idle_interval_s=self._idle_interval_s,
            lease_ttl_s=lease_ttl_s,
            quorum_size=spec.algorithm.quorum_size,
            joined_at=clock(),  # it joined at the newest version
        )
        """When this learner looks for news (``session.looking``): the rules' state, on this clock."""
        self._schedule = schedule or (lambda: _NO_SCHEDULE)
        self._own_bulletin = own_bulletin or (lambda: None)
        self._saved_state = saved_state or (lambda: None)
        """The learner's newest save in the mailbox, which each contribution names (``session.resume``)."""
        learner = algorithm if algorithm is not None else spec.algorithm
        self._carry = bool(learner.carry_unmerged)
        self._overlap_steps = learner.overlap_steps
        self._writes_commits = not self._carry or learner.overlap_steps == 0
        """Whether alignment usually writes a commit's parameters unchanged (else it adds a
        correction): then they are made writable here, so PyTorch wraps them without a copy."""
        self._on_published = on_published
        self.failure: GradientMailError | None = None
        """What stops this learner (another process with its id); ``Session.step`` raises it."""
        self.publish_to_commit_s: collections.deque[float] = collections.deque(maxlen=_LATENCIES_KEPT)
        """Seconds from ``publish()`` to the commit that merged it being ready, newest last."""
        self._next_sequence = 1
        self.bytes_published = 0
        self.commits = CommitReader(store, spec, learner_id)
        """How commits are read (whole, or rebuilt from compact updates) and what that fetched."""
        self.transfers = TransferMeter(clock, len(self._fragments))
        """What share of a sync period the uploads and commit reads need (``session.transfer_meter``)."""
        self._codec = spec.algorithm.delta_codec
        self._feedback = self._codec is not None and learner.error_feedback

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self.renew_lease()
        self._lease_loop.start()
        self._loop.start()

    def stop(self, release_lease: bool = True) -> None:
        self._loop.stop()
        self._lease_loop.stop()
        self._drain_outbox()
        for fragment in self._fragments:
            fragment.release()
        if release_lease:
            try:
                self._lease.release()
            except GradientMailError as exc:
                log.warning("could not release the lease of %s: %s", self._learner, exc)

    # -- the training thread's side -----------------------------------------------
    def publish(self, publication: Publication) -> None:
        """Hand a snapshot over (the training thread's only work for a contribution)."""
        publication.snapshot.held = True
        self._fragments[publication.fragment].published_at[publication.anchor_version] = self._clock()
        self._outbox.put(publication)
        self._loop.wake()

    def commit_available(self, fragment: int, committed: CommittedVersion | None = None) -> None:
        """A commit of ``fragment`` is in the mailbox (the syncer in this process made it):
        fetch it on the next pass, now. ``committed``: its record and parameters as the syncer
        wrote them, taken instead of read back (the same bytes)."""
        self._fragments[fragment].commit_made_here(committed)
        self._loop.wake()

    @property
    def loop(self) -> PollingLoop:
        """The transfers' loop (runs :meth:`exchange_pass`)."""
        return self._loop

    @property
    def lease_loop(self) -> PollingLoop:
        """The lease's loop (runs :meth:`renew_lease` every TTL/3)."""
        return self._lease_loop

    @property
    def lease(self) -> Lease | None:
        """This learner's lease as it last wrote it (None before the first renewal)."""
        return self._lease.written

    @property
    def known_versions(self) -> tuple[int, ...]:
        """The newest version of each fragment this exchange has fetched."""
        return tuple(fragment.known_version for fragment in self._fragments)

    def take_ready(self) -> dict[int, Commit]:
        """The commits fetched since the last call, by fragment (see :meth:`LearnerFragment.take`)."""
        ready: dict[int, Commit] = {}
        for fragment in self._fragments:
            commit = fragment.take()
            if commit is not None:
                ready[fragment.index] = commit
        return ready

    def idle(self) -> bool:
        """True when nothing waits to be published."""
        return self._outbox.unfinished_tasks == 0

    # -- the background side -------------------------------------------------------
    def look_interval_s(self) -> float:
        """Seconds between two looks at the fragments no commit is awaited of, at the learner's
        current schedule (``session.looking``)."""
        return self.looking.look_every_s(self._schedule())

    def watch_interval_s(self) -> float | None:
        """While a commit is awaited, the look interval: how often the node's election watch
        should read the syncer lease (a holder that resigned or died is replaced that soon, and
        the bulletin it reads is fresh); None otherwise (the idle pace)."""
        return self.look_interval_s() if self._awaiting() else None

    def _awaiting(self) -> list[int]:
        return [fragment.index for fragment in self._fragments if fragment.awaiting]

    def _seen(self) -> list[FragmentSeen]:
        """The fragments as the looking rules read them."""
        return [
            FragmentSeen(f.known_version, f.awaiting, f.held.anchor_version if f.held is not None else None)
            for f in self._fragments
        ]

    def live_learners(self) -> int | None:
        """The learners training in the run as the elected syncer counts them: its bulletin's
        (this node's own while it holds the election, else the one its watch read last); None
        before any bulletin was read."""
        own = self._own_bulletin()
        return own.live if own is not None else self.looking.noted_live()

    def note_syncer_lease(self, found: LeaseRead | None) -> None:
        """The syncer lease as this node's election watch just read it (on the election thread):
        its bulletin serves the next look, and news in it wakes the loop now."""
        bulletin = RoundsBulletin.from_lease(found.lease if found is not None else None, len(self._fragments))
        self.looking.note(bulletin, self._clock())
        if bulletin is not None and self.looking.has_news(bulletin, self._seen()):
            self._loop.wake()

    def exchange_pass(self) -> None:
        """One pass of the transfers' loop: upload what was handed over, then fetch commits: of
        the fragments just committed in this process, of those a look finds moved (once per
        look interval), of those awaiting one (each pass while no bulletin is followed, else in
        a hurry: after the upload, and when the bulletin says their round closes), and of one
        about to be due. When to look is ``session.looking``'s to say."""
        self._drain_outbox()
        looking = self.looking
        now = self._clock()
        targets = {fragment.index for fragment in self._fragments if fragment.take_probe()}
        schedule = self._schedule()
        look_every = looking.look_every_s(schedule)
        own = self._own_bulletin()
        from_head = False
        if looking.look_due(now, look_every, own_bulletin=own is not None):
            look = self._look(now, look_every, own)
            targets |= look.probe
            from_head = look.from_head
        following = looking.following(now, look_every)
        awaiting = set(self._awaiting())
        closing = looking.round_closing(now, awaiting)  # every pass: a close kept past its time would zero the pause
        if closing and own is None:
            self._loop.hurry()
        if awaiting and own is None and (not following or self._loop.hurrying or closing):
            targets |= awaiting  # (this node's own commits wake the exchange as they are made)
        targets |= looking.due_soon(schedule)
        self._fetch_commits(sorted(targets), from_head=from_head)
        pace = looking.next_pass(self._clock(), look_every, schedule, awaiting=bool(self._awaiting()), following=following)
        self._loop.interval_s = pace.interval_s
        self._loop.pause_at_most(pace.pause_at_most_s)
        if pace.settle:
            self._loop.settle()

    def _look(self, now: float, look_every: float, own: RoundsBulletin | None) -> Look:
        """One look: follow this node's own bulletin (no request), the one its election watch read
        lately, or one read now; without a bulletin, every fragment, with the watch for open rounds."""
        seen = self._seen()
        bulletin: RoundsBulletin | None
        if own is not None:
            bulletin, read_at = own, now
        else:
            fresh = self.looking.fresh_bulletin(now, look_every)
            bulletin, read_at = fresh if fresh is not None else (self._read_bulletin(), now)
        if bulletin is None:
            self._watch_rounds(seen)
            return self.looking.unfollowed(now)
        if self.looking.set_open_rounds(self.looking.rounds_opened(bulletin, seen)):
            self._on_change()
        return self.looking.followed(now, bulletin, read_at, seen, own=own is not None)

    def _read_bulletin(self) -> RoundsBulletin | None:
        found = self._store.leases.read_syncer(need_token=False)
        return RoundsBulletin.from_lease(found.lease if found is not None else None, len(self._fragments))

    def _watch_rounds(self, seen: list[FragmentSeen]) -> None:
        """Notice rounds other learners have opened on our versions, so we can join them early
        (``looking.joins_with``), from one LIST of each fragment's contributions."""
        others = {
            fragment.index: len(self._store.contributors(fragment.index, fragment.known_version) - {self._learner})
            for fragment in self._fragments
        }
        if self.looking.set_open_rounds(self.looking.rounds_counted(others, seen)):
            self._on_change()

    def _drain_outbox(self) -> None:
        while True:
            try:
                publication = self._outbox.get_nowait()
            except queue.Empty:
                return
            try:
                self._upload(publication)
            finally:
                self._outbox.task_done()

    def _upload(self, publication: Publication) -> None:
        token, size = self.transfers.begin("up"), 0
        try:
            size = self._publish(publication)
        finally:
            self.transfers.end(token, size)

    def _publish(self, publication: Publication) -> int:
        """Compute, encode and upload one contribution; its payload's bytes."""
        fragment = self._fragments[publication.fragment]
        try:  # the snapshot is held from publish() until here, or while its round may merge it
            delta = align.pseudo_gradient(publication.anchor, publication.snapshot.arrays, self._spec.delta_dtype)
        finally:
            fragment.hold(publication, carry=self._carry)
        published = self._store.publish_contribution(
            self._learner,
            fragment.index,
            publication.anchor_version,
            delta
            if self._codec is None
            else encode_delta(self._codec, fragment, publication.anchor_version, delta, feedback=self._feedback),
            publication.counts,
            first_sequence=self._next_sequence,
            compress=self._spec.algorithm.payload_compression == "zstd",
            digest=self._spec.blob_digest,
            saved_state=self._saved_state(),
        )
        self._next_sequence = published.key.sequence + 1
        self.bytes_published += published.size_bytes
        if publication.anchor_version >= fragment.known_version:
            fragment.awaiting = True
            self._loop.hurry()  # the commit is due in about a round trip plus the merge
        if self._on_published is not None:
            # the arrays encoded into the payload, for this node's syncer (a quantized payload: none)
            handed = Handed(published.key, published.record, _read_only(delta)) if self._codec is None else None
            self._on_published(fragment.index, handed)
        return published.size_bytes

    def _fetch_commits(self, indices: list[int], *, from_head: bool = False) -> None:
        # Probing forward from what we know is the cheap common case; ``from_head`` starts from
        # the head pointer instead, so a learner left behind by retention still finds the newest.
        for index in indices:
            fragment = self._fragments[index]
            known = fragment.known_version
            handed = fragment.take_handed()
            if handed is not None and handed.record.version > known:  # made here: taken as it is
                newest, record, params = handed.record.version, handed.record, dict(handed.params)
            else:
                found = self._store.newest_version(index, known=known, from_head=from_head)
                if found is None or found <= known:
                    continue
                token, before = self.transfers.begin("down"), self.commits.bytes_fetched
                try:
                    newest, record = found, self._store.read_round(index, found)
                    params = self.commits.read(index, known, fragment.known_params, record)
                finally:
                    self.transfers.end(token, self.commits.bytes_fetched - before)
            if self._writes_commits:  # the learner writes them as they are: spare it a copy
                params = _writable(params)
            built_on = self._round_built_on(index, known, newest, record)
            ours = any(p.learner == self._learner for p in built_on.participants)
            rejected = next((r.reason for r in built_on.rejected if r.learner == self._learner), None)
            self._note_latency(fragment, known, ours)
            settle_residual(fragment, known, ours)
            with fragment.lock:
                waiting = fragment.ready  # not aligned with yet: the learner's base is still its base
                held = fragment.held
            if waiting is not None:
                base, merged, base_params = waiting.base_version, waiting.merged, waiting.base_params
            else:
                published_base = held.anchor_version if held is not None else None
                merged = held if align.contribution_merged(ours, published_base, known) else None
                base, base_params = known, fragment.known_params
            fragment.known_version, fragment.known_params = newest, params
            fragment.awaiting = False
            commit = Commit(index, newest, params, base, merged, base_params, rejected=rejected)
            fragment.offer(self._with_correction(commit))
            self._on_change()

    def _with_correction(self, commit: Commit) -> Commit:
        """``commit`` with θ_commit − θ_start computed for the start its decision implies, when
        the alignment is expected to carry work (``align.expects_correction``)."""
        start = commit.carry_start
        if start is None or not align.expects_correction(self._carry, commit.merged is not None, self._overlap_steps):
            return commit
        return replace(commit, correction=align.carry_correction(commit.params, start))

    def _note_latency(self, fragment: LearnerFragment, known: int, ours: bool) -> None:
        published_at = fragment.published_at.pop(known, None)
        for stale in [version for version in fragment.published_at if version < known]:
            del fragment.published_at[stale]
        if ours and published_at is not None:
            self.publish_to_commit_s.append(self._clock() - published_at)

    def _round_built_on(self, fragment: int, known: int, newest: int, record: RoundRecord) -> RoundRecord:
        """The round that followed ``known`` (``record`` itself when it did); an empty one when
        retention already collected it (we were far behind: nothing of ours was in it)."""
        if newest == known + 1:
            return record
        try:
            return self._store.read_round(fragment, known + 1)
        except KeyNotFound:
            return record.model_copy(update={"participants": ()})

    def renew_lease(self) -> None:
        """Renew this learner's lease with what ``lease_info`` says (the lease loop's pass). A
        second process with our id stops the renewals and is handed to the training thread
        (``failure``)."""
        if self.failure is not None:
            return
        try:
            self._lease.renew(self._lease_info())
        except DuplicateLearner as exc:
            log.error("%s", exc)
            self.failure = exc
            self._on_change()
            return
        probe_in = self._lease.next_probe_in()
        if probe_in is not None:  # the next renewal also pins the store's clock (store.leases)
            self._lease_loop.pause_at_most(probe_in)
