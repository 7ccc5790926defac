"""The learner's background exchange: publish contributions, fetch commits, renew the lease.

Transfers run on one polling loop and the lease on another, so a slow upload never delays a
renewal. Both touch only NumPy arrays and the store, never the model: the training thread
hands a snapshot of the fragment's parameters already copied to host memory (one copy, into
a reused :class:`HostBuffer`), and this thread computes the delta (anchor − snapshot, cast
to the travel dtype), encodes, hashes and uploads it. For a fetched commit it also computes,
when the run carries unmerged work, the correction θ_commit − θ_start that alignment adds to
the live parameters, so the training thread only writes.

Polling (docs/session.md, "Polling"): after an upload the loop hurries (short pauses that back
off to ``poll_interval_s`` within a bound) and probes only the fragments awaiting a commit;
the full pass over every fragment, with the watch for rounds others opened, runs every
``poll_interval_s`` while a commit is awaited and every ``idle_interval_s`` (a third of the
lease TTL by default) while none is: an idle learner costs a HEAD and a LIST per fragment per
idle interval and a lease PUT per TTL/3, whatever the number of learners.
``commit_available()`` (the syncer in the same process) runs the next pass at once.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends.payload import numpy_dtype
from gradientmail.backends.quantize import quantize, quantize_with_feedback
from gradientmail.backends.quantized_payload import encode_parts
from gradientmail.errors import CorruptPayload, GradientMailError, IncompatiblePayload, KeyNotFound
from gradientmail.polling import PollingLoop, idle_interval
from gradientmail.records import RoundRecord
from gradientmail.store import ContributionCounts, LearnerLease, RunSpec, RunStore

__all__ = ["Commit", "Exchange", "HostBuffer", "Publication", "delta_of"]

log = logging.getLogger(__name__)

_LATENCIES_KEPT = 1000
HEAD_CHECK_TTLS = 3
"""The learner starts from the head pointer instead of its known version once per this many
lease TTLs (a learner left behind by retention still finds the newest version)."""


@dataclass(eq=False)
class HostBuffer:
    """Host arrays holding one snapshot of a fragment's parameters, reused from publish to
    publish. ``held`` is True while the exchange may still read it (from the publication until
    the next one of the fragment, or until its round is over); the training thread refills
    only a buffer that is neither held nor its own ``published_params``."""

    arrays: dict[str, np.ndarray]
    targets: dict[str, object] = field(default_factory=dict)
    """Framework views of ``arrays`` the training thread copies into (PyTorch: CPU tensors
    sharing their memory); empty where the arrays are filled directly."""
    held: bool = False


@dataclass(frozen=True)
class Publication:
    """A fragment's snapshot ready to go, with the anchor its delta is taken against and the
    counts it reports. The exchange computes the delta from them on its own thread."""

    fragment: int
    anchor_version: int
    anchor: Mapping[str, np.ndarray]
    snapshot: HostBuffer
    counts: ContributionCounts
    serial: int = 0
    """The learner's count of publications: names this snapshot in ``Commit.correction_from``."""


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
    base_params: Mapping[str, np.ndarray] | None = None
    """The parameters of ``base_version`` as this exchange knows them (its fetch, or the initial
    anchor): the start of the correction when the commit merged nothing of ours."""
    correction: dict[str, np.ndarray] | None = None
    """θ_commit − θ_start in fp32, computed here so that alignment only adds it in place."""
    correction_from: tuple[str, int] | None = None
    """Which θ_start ``correction`` assumed: ``("published", serial)`` or ``("anchor", version)``;
    the learner uses it only when its own choice of start is the same."""


@dataclass
class Residual:
    """What one contribution's codes could not carry (fp32), and whether its round merged it."""

    anchor_version: int
    arrays: dict[str, np.ndarray]
    merged: bool = False


def delta_of(
    anchor: Mapping[str, np.ndarray], local: Mapping[str, np.ndarray], dtype_of: Callable[[str], str]
) -> dict[str, np.ndarray]:
    """Δ = anchor − local in fp32, cast to the travel dtype: ``pseudo_gradient`` on host arrays
    (the same IEEE operations, so the same bits as any backend computing it)."""
    delta: dict[str, np.ndarray] = {}
    for name, base in anchor.items():
        difference = np.subtract(np.asarray(base, dtype=np.float32), np.asarray(local[name], dtype=np.float32))
        dtype = numpy_dtype(dtype_of(name))
        delta[name] = difference if dtype == np.float32 else difference.astype(dtype)
    return delta


def _writable(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Arrays a framework can wrap without copying (decoded payloads are read-only views)."""
    return {name: a if a.flags.writeable else a.copy() for name, a in params.items()}


class Exchange:
    """Background worker for one learner. ``on_change`` is called when a commit is ready,
    ``on_published`` with the fragment after each upload. ``anchors`` are the parameters of
    ``known_versions`` (the start of corrections); ``algorithm`` is the learner's own (its
    ``carry_unmerged`` and ``overlap_steps``), the run's when None.

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
        idle_interval_s: float | None = None,
        anchors: list[Mapping[str, np.ndarray]] | None = None,
        on_published: Callable[[int], None] | None = None,
        algorithm: DiLoCo | None = None,
    ) -> None:
        self._store = store
        self._spec = spec
        self._learner = learner_id
        self._known = list(known_versions)
        self._lease = LearnerLease(store, learner_id, lease_ttl_s)
        self._lease_info = lease_info
        self._lease_loop = PollingLoop(f"gm-lease-{learner_id}", self._renew_lease, lease_ttl_s / 3)
        self._head_every_s = HEAD_CHECK_TTLS * lease_ttl_s
        self._head_checked_at = float("-inf")
        self._clock = clock
        self._on_change = on_change
        self._outbox: queue.Queue[Publication] = queue.Queue()
        self._ready: dict[int, Commit] = {}
        self._lock = threading.Lock()
        self._poll_interval_s = poll_interval_s
        self._idle_interval_s = idle_interval(poll_interval_s, lease_ttl_s, idle_interval_s)
        self._loop = PollingLoop(f"gm-exchange-{learner_id}", self._pass, self._idle_interval_s)
        self._full_at = float("-inf")
        self._known_params: list[Mapping[str, np.ndarray] | None] = list(anchors) if anchors else [None] * len(known_versions)
        learner = algorithm if algorithm is not None else spec.algorithm
        self._carry = bool(learner.carry_unmerged)
        self._overlap_zero = learner.overlap_steps == 0
        self._writes_commits = not self._carry or self._overlap_zero
        """Whether alignment usually writes a commit's parameters unchanged (else it adds a
        correction): then they are made writable here, so PyTorch wraps them without a copy."""
        self._on_published = on_published
        self._published: dict[int, Publication] = {}
        """Fragment → its newest uploaded publication, whose snapshot we hold while its round may
        still merge it (the start of the correction when it does)."""
        self._awaiting: set[int] = set()
        """Fragments with an upload and no commit since: probed on every (hurried) pass."""
        self._probe: set[int] = set()
        """Fragments the syncer in this process just committed: probed on the next pass."""
        self._published_at: dict[tuple[int, int], float] = {}
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
        self._residuals: dict[int, Residual] = {}
        """Fragment → what its last contribution's codes could not carry (error feedback)."""

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._renew_lease()
        self._lease_loop.start()
        self._loop.start()

    def stop(self, release_lease: bool = True) -> None:
        self._loop.stop()
        self._lease_loop.stop()
        self._drain_outbox()
        for publication in self._published.values():
            publication.snapshot.held = False
        self._published.clear()
        if release_lease:
            try:
                self._lease.release()
            except GradientMailError as exc:
                log.warning("could not release the lease of %s: %s", self._learner, exc)

    # -- the training thread's side -----------------------------------------------
    def publish(self, publication: Publication) -> None:
        """Hand a snapshot over (the training thread's only work for a contribution)."""
        publication.snapshot.held = True
        self._published_at[(publication.fragment, publication.anchor_version)] = self._clock()
        self._outbox.put(publication)
        self._loop.wake()

    def commit_available(self, fragment: int) -> None:
        """A commit of ``fragment`` is in the mailbox (the syncer in this process made it):
        fetch it on the next pass, now."""
        with self._lock:
            self._probe.add(fragment)
        self._loop.wake()

    @property
    def loop(self) -> PollingLoop:
        return self._loop

    def take_ready(self) -> dict[int, Commit]:
        """The commits fetched since the last call; the snapshots of rounds they end stop being
        held (the learner aligns with them now)."""
        if not self._ready:  # the common case, without the lock
            return {}
        with self._lock:
            ready, self._ready = self._ready, {}
            for fragment, commit in ready.items():
                published = self._published.get(fragment)
                if published is not None and published.anchor_version < commit.version:
                    del self._published[fragment]
                    published.snapshot.held = False
        return ready

    def idle(self) -> bool:
        """True when nothing waits to be published."""
        return self._outbox.unfinished_tasks == 0

    # -- the background side -------------------------------------------------------
    @property
    def full_interval_s(self) -> float:
        """The pace of the full pass now: ``poll_interval_s`` while a commit is awaited, else the
        idle interval."""
        return self._poll_interval_s if self._awaiting else self._idle_interval_s

    def _pass(self) -> None:
        self._drain_outbox()
        # The full pass keeps its pace (regular while a commit is awaited, idle otherwise);
        # passes in between (a hurry, a wake-up) probe only the fragments awaiting a commit or
        # just committed in this process, one HEAD each.
        now = self._clock()
        every = self.full_interval_s
        full = now - self._full_at >= 0.9 * every
        with self._lock:
            probe, self._probe = self._probe, set()
        if full:
            self._full_at = now
            self._fetch_commits(range(len(self._known)))
            self._watch_rounds()
        else:
            self._fetch_commits(sorted(probe | self._awaiting))
        every = self.full_interval_s  # a fetched commit may have ended the wait
        self._loop.interval_s = every
        self._loop.pause_at_most(max(0.0, self._full_at + every - self._clock()))  # keep the full pass's pace
        if not self._awaiting:
            self._loop.settle()

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
        fragment = publication.fragment
        try:  # the snapshot is held from publish() until here, or while its round may merge it
            delta = delta_of(publication.anchor, publication.snapshot.arrays, self._spec.delta_dtype)
        finally:
            with self._lock:
                previous = self._published.pop(fragment, None)
                if previous is not None:
                    previous.snapshot.held = False
                if self._carry and publication.anchor_version >= self._known[fragment]:
                    self._published[fragment] = publication  # a commit merging it starts the correction here
                else:
                    publication.snapshot.held = False
        key, size = self._store.publish_contribution(
            self._learner,
            fragment,
            publication.anchor_version,
            delta if self._codec is None else self._quantized(fragment, publication.anchor_version, delta),
            publication.counts,
            first_sequence=self._next_sequence,
        )
        self._next_sequence = key.sequence + 1
        self.bytes_published += size
        if publication.anchor_version >= self._known[fragment]:
            self._awaiting.add(fragment)
            self._loop.hurry()  # the commit is due in about a round trip plus the merge
        if self._on_published is not None:
            self._on_published(fragment)

    def _fetch_commits(self, fragments: range | list[int]) -> None:
        # Probing forward from what we know is the cheap common case; once a TTL, start from the
        # head pointer instead, so a learner left behind by retention still finds the newest.
        from_head = self._clock() - self._head_checked_at >= self._head_every_s
        if from_head:
            self._head_checked_at = self._clock()
        for fragment in fragments:
            known = self._known[fragment]
            newest = self._store.newest_version(fragment, known=None if from_head else known)
            if newest is None or newest <= known:
                continue
            record = self._store.read_round(fragment, newest)
            params = self._read_commit(fragment, known, record)
            if self._writes_commits:  # the learner writes them as they are: spare it a copy
                params = _writable(params)
            ours = any(p.learner == self._learner for p in self._round_built_on(fragment, known, newest, record).participants)
            self._note_latency(fragment, known, ours)
            self._settle_residual(fragment, known, ours)
            known_params = self._known_params[fragment]
            self._known[fragment], self._known_params[fragment] = newest, params
            self._awaiting.discard(fragment)
            with self._lock:
                waiting = self._ready.get(fragment)  # not aligned with yet: the learner's base is still its base
            if waiting is not None:
                base, ours, base_params = waiting.base_version, waiting.ours_merged, waiting.base_params
            else:
                base, base_params = known, known_params
            commit = self._with_correction(Commit(fragment, newest, params, base, ours, base_params))
            with self._lock:
                self._ready[fragment] = commit
            self._on_change()

    def _quantized(self, fragment: int, anchor_version: int, delta: Mapping[str, np.ndarray]) -> bytes:
        """The quantized payload of ``delta``; with error feedback, plus the residual of the
        fragment's previous contribution when its round merged it (else that residual belongs to
        work the carry already re-sends, or that was dropped: it is dropped too)."""
        assert self._codec is not None
        previous = self._residuals.pop(fragment, None)
        carried = previous.arrays if previous is not None and previous.merged else {}
        parts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        left: dict[str, np.ndarray] = {}
        for name, value in delta.items():
            if self._feedback:
                codes, scales, left[name] = quantize_with_feedback(value, carried.get(name), self._codec)
            else:
                codes, scales = quantize(value, self._codec)
            parts[name] = (codes, scales)
        if self._feedback:
            self._residuals[fragment] = Residual(anchor_version, left)
        return encode_parts(parts, self._codec)

    def _settle_residual(self, fragment: int, known: int, ours: bool) -> None:
        """A commit built on ``known`` arrived: the residual of a contribution against ``known``
        is kept for the next one if the round merged ours, else dropped."""
        residual = self._residuals.get(fragment)
        if residual is None or residual.merged or residual.anchor_version > known:
            return
        if residual.anchor_version == known and ours:
            residual.merged = True
        else:
            del self._residuals[fragment]

    def _read_commit(self, fragment: int, known: int, record: RoundRecord) -> dict[str, np.ndarray]:
        """The parameters ``record`` commits: rebuilt from the compact updates of the versions
        since ``known`` when we hold its parameters and those updates weigh less than the
        parameters (each step checked against that version's committed checksum), else read whole."""
        base = self._known_params[fragment]
        chain = self._update_chain(fragment, known, record) if base is not None else []
        if base is not None and chain:
            try:
                for step in chain:
                    base = self._store.rebuild_params(self._spec, step, base)
            except (CorruptPayload, IncompatiblePayload, KeyNotFound) as exc:
                self.compact_fallbacks += 1
                log.warning("learner %s: %s; reading the full parameters", self._learner, exc)
            else:
                self.compact_fetches += 1
                self.bytes_fetched += sum(step.update.size_bytes for step in chain if step.update is not None)
                return dict(base)
        self.bytes_fetched += record.params.size_bytes
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
            if chain[0].update is None or sum(r.update.size_bytes for r in chain if r.update) >= record.params.size_bytes:
                return []
        return chain

    def _with_correction(self, commit: Commit) -> Commit:
        """``commit`` with θ_commit − θ_start computed for the start the learner will most likely
        pick (the snapshot it published when the commit merged it, else its anchor)."""
        if not self._carry:
            return commit
        with self._lock:
            published = self._published.get(commit.fragment)
        start: Mapping[str, np.ndarray]
        if commit.ours_merged and published is not None and published.anchor_version == commit.base_version:
            if self._overlap_zero:
                return commit  # the learner waited at its publish: nothing to carry, it writes the commit
            start, source = published.snapshot.arrays, ("published", published.serial)
        elif commit.base_params is not None:
            start, source = commit.base_params, ("anchor", commit.base_version)
        else:
            return commit
        correction = {
            name: np.subtract(np.asarray(value, dtype=np.float32), np.asarray(start[name], dtype=np.float32))
            for name, value in commit.params.items()
        }
        return Commit(
            commit.fragment,
            commit.version,
            commit.params,
            commit.base_version,
            commit.ours_merged,
            commit.base_params,
            correction,
            source,
        )

    def _note_latency(self, fragment: int, known: int, ours: bool) -> None:
        published_at = self._published_at.pop((fragment, known), None)
        for stale in [k for k in self._published_at if k[0] == fragment and k[1] < known]:
            del self._published_at[stale]
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
