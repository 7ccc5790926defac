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
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gradientmail.algorithms import align
from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.algorithms.schedule import look_interval
from gradientmail.backends.quantize import quantize, quantize_with_feedback
from gradientmail.backends.quantized_payload import encode_parts, encode_sparse_parts
from gradientmail.backends.sparse import SparseCodec, sparsify, sparsify_with_feedback
from gradientmail.errors import CorruptPayload, DuplicateLearner, GradientMailError, IncompatiblePayload, KeyNotFound
from gradientmail.polling import PollingLoop, idle_interval
from gradientmail.records import Lease, RoundRecord
from gradientmail.session.fragment import Commit, LearnerFragment, Publication, Residual
from gradientmail.session.looking import LearnerSchedule, due_lead_s
from gradientmail.store import UNKNOWN_HEAD, CommittedVersion, LearnerLease, LeaseRead, RoundsBulletin, RunSpec, RunStore
from gradientmail.store.store_clock import StoreClock
from gradientmail.syncer.rounds import Handed

__all__ = ["Exchange"]

log = logging.getLogger(__name__)

_LATENCIES_KEPT = 1000
HEAD_CHECK_TTLS = 3
"""Without a bulletin to follow, the learner starts from the head pointer instead of its known
version once per this many lease TTLs (a learner left behind by retention still finds the newest
version); following one, whenever the bulletin's head is more than one version ahead."""
BULLETIN_CHECK_TTLS = 10
"""Following another node's bulletin (a hint), the learner checks one fragment in turn from its
head pointer once per this many lease TTLs: a bulletin that lags or lies hides a version from an
idle learner for at most this many TTLs times the fragments (a training one probes each fragment
before its publish anyway)."""
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
    ) -> None:
        self._store = store
        self._spec = spec
        self._learner = learner_id
        self._fragments = list(fragments)
        self._lease = LearnerLease(store, learner_id, lease_ttl_s, clock=clock, store_clock=store_clock)
        self._lease_info = lease_info
        self._lease_loop = PollingLoop(f"gm-lease-{learner_id}", self.renew_lease, lease_ttl_s / 3)
        self._head_every_s = HEAD_CHECK_TTLS * lease_ttl_s
        self._bulletin_check_every_s = BULLETIN_CHECK_TTLS * lease_ttl_s
        self._head_checked_at = clock()  # it joined at the newest version
        self._clock = clock
        self._on_change = on_change
        self._outbox: queue.Queue[Publication] = queue.Queue()
        self._poll_interval_s = poll_interval_s
        self._idle_interval_s = idle_interval(poll_interval_s, lease_ttl_s, idle_interval_s)
        self._loop = PollingLoop(f"gm-exchange-{learner_id}", self.exchange_pass, self._idle_interval_s)
        self._looked_at = float("-inf")
        self._schedule = schedule or (lambda: _NO_SCHEDULE)
        self._own_bulletin = own_bulletin or (lambda: None)
        self._noted: tuple[RoundsBulletin | None, float] | None = None
        """The bulletin in the syncer lease this node's election watch read last, and when."""
        self._next_head_check = 0
        """The fragment a look that follows a bulletin checks from its head pointer next."""
        self._followed_at = float("-inf")
        """When a look last followed a bulletin (else it probes every fragment)."""
        self._closes_at: dict[int, tuple[float, int]] = {}
        """Fragment → when the round our contribution is in closes, as the bulletin announced, and
        its base version."""
        self._hurried_for: dict[int, int] = {}
        """Fragment → the base version of the round whose announced close the exchange hurried for."""
        self._probed_for_due: dict[int, int] = {}
        """Fragment → the due step its head was probed ahead of."""
        learner = algorithm if algorithm is not None else spec.algorithm
        self._carry = bool(learner.carry_unmerged)
        self._overlap_steps = learner.overlap_steps
        self._writes_commits = not self._carry or learner.overlap_steps == 0
        """Whether alignment usually writes a commit's parameters unchanged (else it adds a
        correction): then they are made writable here, so PyTorch wraps them without a copy."""
        self._on_published = on_published
        self._probe: set[int] = set()
        """Fragments the syncer in this process just committed: probed on the next pass."""
        self._handed_commits: dict[int, CommittedVersion] = {}
        """Fragment → the newest commit the syncer in this process made of it, handed in memory."""
        self.failure: GradientMailError | None = None
        """What stops this learner (another process with its id); ``Session.step`` raises it."""
        self._probe_lock = threading.Lock()
        self.publish_to_commit_s: collections.deque[float] = collections.deque(maxlen=_LATENCIES_KEPT)
        """Seconds from ``publish()`` to the commit that merged it being ready, newest last."""
        self._next_sequence = 1
        self.open_rounds: dict[int, int] = {}
        """Fragment → the version other learners have opened a round on (see ``_watch_rounds``)."""
        self.bytes_published = 0
        self.bytes_fetched = 0
        self.compact_fetches = 0
        """Commits rebuilt from their compact update (``update_quantization``)."""
        self.compact_fallbacks = 0
        """Compact updates that did not rebuild the committed bytes: full parameters read instead."""
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
        with self._probe_lock:
            self._probe.add(fragment)
            if committed is not None:
                self._handed_commits[fragment] = committed
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
        current schedule (``session.looking.look_interval``)."""
        return look_interval(self._poll_interval_s, self._idle_interval_s, self._schedule().period_s)

    def watch_interval_s(self) -> float | None:
        """While a commit is awaited, the look interval: how often the node's election watch
        should read the syncer lease (a holder that resigned or died is replaced that soon, and
        the bulletin it reads is fresh); None otherwise (the idle pace)."""
        return self.look_interval_s() if self._awaiting() else None

    def _awaiting(self) -> list[int]:
        return [fragment.index for fragment in self._fragments if fragment.awaiting]

    def live_learners(self) -> int | None:
        """The learners training in the run as the elected syncer counts them: its bulletin's
        (this node's own while it holds the election, else the one its watch read last); None
        before any bulletin was read."""
        own = self._own_bulletin()
        noted = self._noted
        bulletin = own if own is not None else noted[0] if noted is not None else None
        return bulletin.live if bulletin is not None else None

    def note_syncer_lease(self, found: LeaseRead | None) -> None:
        """The syncer lease as this node's election watch just read it (on the election thread):
        its bulletin serves the next look, and news in it wakes the loop now."""
        bulletin = RoundsBulletin.from_lease(found.lease if found is not None else None, len(self._fragments))
        self._noted = (bulletin, self._clock())
        if bulletin is not None and (self._moved(bulletin) or self._rounds_opened(bulletin) != self.open_rounds):
            self._loop.wake()

    def exchange_pass(self) -> None:
        """One pass of the transfers' loop: upload what was handed over, then fetch commits: of
        the fragments just committed in this process, of those a look finds moved (once per
        look interval), of those awaiting one (each pass while no bulletin is followed, else in
        a hurry: after the upload, and when the bulletin says their round closes), and of one
        about to be due."""
        self._drain_outbox()
        now = self._clock()
        with self._probe_lock:
            probe, self._probe = self._probe, set()
        schedule = self._schedule()
        look_every = look_interval(self._poll_interval_s, self._idle_interval_s, schedule.period_s)
        targets, from_head = set(probe), False
        noted = self._noted
        if (
            self._own_bulletin() is not None  # this node holds the election: looking is free
            or now - self._looked_at >= 0.9 * look_every
            or (noted is not None and noted[1] > self._looked_at)  # the election watch just read one
        ):
            self._looked_at = now
            moved, from_head = self._look(now, look_every)
            targets |= moved
        following = now - self._followed_at <= look_every + self._poll_interval_s
        awaiting = set(self._awaiting())
        closing = self._round_closing(now, awaiting)  # every pass: a close kept past its time would zero the pause
        if awaiting and self._own_bulletin() is None and (not following or self._loop.hurrying or closing):
            targets |= awaiting  # (this node's own commits wake the exchange as they are made)
        targets |= self._due_soon(schedule)
        self._fetch_commits(sorted(targets), from_head=from_head)
        # the next pass: at the regular pace while a commit is awaited and no bulletin followed,
        # else at the look pace, and no later than the next look, the next round's announced
        # close or the next fragment's probe before its publish
        awaiting_now = bool(self._awaiting())
        self._loop.interval_s = self._poll_interval_s if awaiting_now and not following else look_every
        now = self._clock()
        wakes = (self._looked_at + look_every - now, self._next_due_probe_in(schedule), self._next_close_in(now))
        self._loop.pause_at_most(max(0.0, min(wakes)))
        if not awaiting_now:
            self._loop.settle()

    def _look(self, now: float, look_every: float) -> tuple[set[int], bool]:
        """The fragments a look finds moved, and whether to find their newest from the head
        pointer: what the bulletin says (no request when this node holds the election or its
        watch read the lease lately), else every fragment, with the watch for open rounds."""
        own = self._own_bulletin()
        bulletin, read_at = (own, now) if own is not None else self._bulletin(now, look_every)
        if bulletin is None:
            self._watch_rounds()
            from_head = now - self._head_checked_at >= self._head_every_s
            if from_head:
                self._head_checked_at = now
            return set(range(len(self._fragments))), from_head
        self._followed_at = now
        opened = self._rounds_opened(bulletin)
        if opened != self.open_rounds:
            self.open_rounds = opened
            if opened:
                self._on_change()
        if own is None:  # this node's own commits wake the exchange as they are made
            self._note_closings(bulletin, read_at)
        moved = {
            fragment.index
            for fragment, head in zip(self._fragments, bulletin.heads, strict=True)
            if head == UNKNOWN_HEAD or head > fragment.known_version
        }
        gap = any(head > fragment.known_version + 1 for fragment, head in zip(self._fragments, bulletin.heads, strict=True))
        if not own and now - self._head_checked_at >= self._bulletin_check_every_s:
            # another node's bulletin is a hint: one fragment in turn is checked from its head anyway
            self._head_checked_at = now
            moved.add(self._next_head_check % len(self._fragments))
            self._next_head_check += 1
            gap = True
        return moved, gap  # a gap: retention may have taken the versions between

    def _note_closings(self, bulletin: RoundsBulletin, read_at: float) -> None:
        """When the rounds our awaited contributions are in close, as the bulletin read at
        ``read_at`` announces: the exchange hurries then, once per round."""
        for fragment in self._fragments:
            note = bulletin.open.get(fragment.index)
            held = fragment.held
            if not fragment.awaiting or held is None or note is None or note.closes_in_s is None:
                continue
            if note.base_version == held.anchor_version and self._hurried_for.get(fragment.index) != note.base_version:
                self._closes_at[fragment.index] = (read_at + note.closes_in_s, note.base_version)

    def _round_closing(self, now: float, awaiting: set[int]) -> bool:
        """Whether a round we await has reached its announced close: hurry to fetch its commit.
        Drops every announced close that has passed or whose contribution is no longer awaited
        (its commit came first), so that :meth:`_next_close_in` only ever names one ahead."""
        closing = False
        for index, (at, base) in list(self._closes_at.items()):
            if index in awaiting and at > now:
                continue
            del self._closes_at[index]
            self._hurried_for[index] = base
            closing |= index in awaiting
        if closing and self._own_bulletin() is None:
            self._loop.hurry()
        return closing

    def _next_close_in(self, now: float) -> float:
        return min((at - now for at, _ in self._closes_at.values()), default=float("inf"))

    def _bulletin(self, now: float, look_every: float) -> tuple[RoundsBulletin | None, float]:
        """The freshest bulletin of another node for a look, and when it was read: the one this
        node's election watch read within a look interval (and a poll), else one read now."""
        noted = self._noted
        if noted is not None and now - noted[1] <= look_every + self._poll_interval_s:
            return noted
        found = self._store.read_syncer_lease(need_token=False)
        return RoundsBulletin.from_lease(found.lease if found is not None else None, len(self._fragments)), now

    def _moved(self, bulletin: RoundsBulletin) -> bool:
        return any(
            head == UNKNOWN_HEAD or head > fragment.known_version
            for fragment, head in zip(self._fragments, bulletin.heads, strict=True)
        )

    def _rounds_opened(self, bulletin: RoundsBulletin) -> dict[int, int]:
        """The rounds on our known versions with enough contributions from others to join (the
        rule of :meth:`_watch_rounds`, from the bulletin's counts less our own contribution)."""
        needed = max(1, self._spec.algorithm.quorum_size - 1)
        opened = {}
        for fragment in self._fragments:
            note = bulletin.open.get(fragment.index)
            if note is None or note.base_version != fragment.known_version:
                continue
            held = fragment.held
            ours = int(fragment.awaiting and held is not None and held.anchor_version == note.base_version)
            if note.accepted - ours >= needed:
                opened[fragment.index] = note.base_version
        return opened

    def _due_soon(self, schedule: LearnerSchedule) -> set[int]:
        """Fragments whose scheduled publish is within ``due_lead_s``, each probed once per due
        step, so the publish goes out on the newest version."""
        lead = due_lead_s(self._poll_interval_s)
        soon = {index for index, due_in in self._unprobed_dues(schedule) if due_in <= lead}
        for index in soon:
            self._probed_for_due[index] = schedule.due_steps[index]
        return soon

    def _next_due_probe_in(self, schedule: LearnerSchedule) -> float:
        """Seconds until the next fragment enters its probe window before a publish (inf: none)."""
        lead = due_lead_s(self._poll_interval_s)
        return max(0.0, min((due_in - lead for _, due_in in self._unprobed_dues(schedule)), default=float("inf")))

    def _unprobed_dues(self, schedule: LearnerSchedule) -> list[tuple[int, float]]:
        """(fragment, seconds to its scheduled publish) of those not probed ahead of it yet."""
        return [
            (index, due_in)
            for index, (due_in, due_step) in enumerate(zip(schedule.due_in_s, schedule.due_steps, strict=False))
            if due_in is not None and self._probed_for_due.get(index) != due_step
        ]

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
        fragment = self._fragments[publication.fragment]
        try:  # the snapshot is held from publish() until here, or while its round may merge it
            delta = align.pseudo_gradient(publication.anchor, publication.snapshot.arrays, self._spec.delta_dtype)
        finally:
            fragment.hold(publication, carry=self._carry)
        published = self._store.publish_contribution(
            self._learner,
            fragment.index,
            publication.anchor_version,
            delta if self._codec is None else self._quantized(fragment, publication.anchor_version, delta),
            publication.counts,
            first_sequence=self._next_sequence,
            compress=self._spec.algorithm.payload_compression == "zstd",
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

    def _fetch_commits(self, indices: list[int], *, from_head: bool = False) -> None:
        # Probing forward from what we know is the cheap common case; ``from_head`` starts from
        # the head pointer instead, so a learner left behind by retention still finds the newest.
        for index in indices:
            fragment = self._fragments[index]
            known = fragment.known_version
            with self._probe_lock:
                handed = self._handed_commits.pop(index, None)
            if handed is not None and handed.record.version > known:  # made here: taken as it is
                newest, record, params = handed.record.version, handed.record, dict(handed.params)
            else:
                found = self._store.newest_version(index, known=known, from_head=from_head)
                if found is None or found <= known:
                    continue
                newest, record = found, self._store.read_round(index, found)
                params = self.read_commit(fragment, record)
            if self._writes_commits:  # the learner writes them as they are: spare it a copy
                params = _writable(params)
            ours = any(p.learner == self._learner for p in self._round_built_on(index, known, newest, record).participants)
            self._note_latency(fragment, known, ours)
            self._settle_residual(fragment, known, ours)
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
            commit = Commit(index, newest, params, base, merged, base_params)
            fragment.offer(self._with_correction(commit))
            self._on_change()

    def _quantized(self, fragment: LearnerFragment, anchor_version: int, delta: Mapping[str, np.ndarray]) -> bytes:
        """The quantized payload of ``delta``; with error feedback, plus the residual of the
        fragment's previous contribution when its round merged it (else that residual belongs to
        work the carry already re-sends, or that was dropped: it is dropped too)."""
        codec = self._codec
        assert codec is not None
        previous, fragment.residual = fragment.residual, None
        carried = previous.arrays if previous is not None and previous.merged else {}
        left: dict[str, np.ndarray] = {}
        if isinstance(codec, SparseCodec):
            sparse: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
            for name, value in delta.items():
                if self._feedback:
                    offsets, codes, scales, left[name] = sparsify_with_feedback(value, carried.get(name), codec)
                    sparse[name] = (offsets, codes, scales)
                else:
                    sparse[name] = sparsify(value, codec)
            data = encode_sparse_parts(sparse, codec)
        else:
            parts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            for name, value in delta.items():
                if self._feedback:
                    codes, scales, left[name] = quantize_with_feedback(value, carried.get(name), codec)
                else:
                    codes, scales = quantize(value, codec)
                parts[name] = (codes, scales)
            data = encode_parts(parts, codec)
        if self._feedback:
            fragment.residual = Residual(anchor_version, left)
        return data

    def _settle_residual(self, fragment: LearnerFragment, known: int, ours: bool) -> None:
        """A commit built on ``known`` arrived: the residual of a contribution against ``known``
        is kept for the next one if the round merged it, else dropped (one not yet due stays)."""
        residual = fragment.residual
        if residual is None or residual.merged or residual.anchor_version > known:
            return
        if align.contribution_merged(ours, residual.anchor_version, known):
            residual.merged = True
        else:
            fragment.residual = None

    def read_commit(self, fragment: LearnerFragment, record: RoundRecord) -> dict[str, np.ndarray]:
        """The parameters ``record`` commits: rebuilt from the compact updates of the versions
        since the fragment's known one when we hold its parameters and those updates weigh less
        than the parameters (each step checked against that version's committed checksum), else
        read whole. Counts what it fetched (``bytes_fetched``, ``compact_fetches``,
        ``compact_fallbacks``); changes nothing else."""
        base = fragment.known_params
        chain = self._update_chain(fragment.index, fragment.known_version, record) if base is not None else []
        if base is not None and chain:
            try:
                for step in chain:
                    base = self._store.rebuild_params(self._spec, step, base)
            except (CorruptPayload, IncompatiblePayload, KeyNotFound) as exc:
                self.compact_fallbacks += 1
                log.warning("learner %s: %s; reading the full parameters", self._learner, exc)
            else:
                self.compact_fetches += 1
                self.bytes_fetched += sum(step.update.wire_bytes for step in chain if step.update is not None)
                return dict(base)
        self.bytes_fetched += record.params.wire_bytes
        return self._store.read_params(self._spec, record)

    def _update_chain(self, fragment: int, known: int, record: RoundRecord) -> list[RoundRecord]:
        """The round records from ``known`` + 1 to ``record`` if each carries a compact update on
        the version before it and together they weigh less than ``record``'s parameters; else []."""
        if record.update is None:
            return []
        chain = [record]
        while chain[0].base_version != known:
            previous = chain[0].base_version
            if previous is None or previous <= known:
                return []
            try:
                chain.insert(0, self._store.read_round(fragment, previous))
            except (KeyNotFound, GradientMailError):
                return []  # retention took it, or it does not verify: read the parameters
            if chain[0].update is None or sum(r.update.wire_bytes for r in chain if r.update) >= record.params.wire_bytes:
                return []
        return chain

    def _with_correction(self, commit: Commit) -> Commit:
        """``commit`` with θ_commit − θ_start computed for the start its decision implies, when
        the alignment is expected to carry work (``align.expects_correction``)."""
        start = commit.carry_start
        if start is None or not align.expects_correction(self._carry, commit.merged is not None, self._overlap_steps):
            return commit
        return Commit(
            commit.fragment,
            commit.version,
            commit.params,
            commit.base_version,
            commit.merged,
            commit.base_params,
            align.carry_correction(commit.params, start),
        )

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

    def _watch_rounds(self) -> None:
        """Notice rounds other learners have opened on our versions, so we can join them early:
        one short of quorum (quorum ≥ 2), or any open round (quorum 1, where the grace window
        waits for late arrivals)."""
        needed = max(1, self._spec.algorithm.quorum_size - 1)
        opened = {
            fragment.index: fragment.known_version
            for fragment in self._fragments
            if len(self._store.contributors(fragment.index, fragment.known_version) - {self._learner}) >= needed
        }
        if opened != self.open_rounds:
            self.open_rounds = opened
            if opened:
                self._on_change()

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
