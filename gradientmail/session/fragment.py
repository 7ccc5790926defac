"""One fragment as a learner holds it: the object that owns its state on both threads.

As torchft's per-fragment object does, :class:`LearnerFragment` keeps everything about one
fragment together: what the learner is aligned with and where its unmerged work begins (the
training thread's side), what the exchange has fetched and holds for a round in flight (the
exchange thread's side), and the hand-over between them (the outstanding publication, the
commit ready to align with), guarded by the fragment's lock. The rule itself — the delta,
"was our contribution merged?", the alignment plan, the carry correction — lives in
:mod:`gradientmail.algorithms.align`; this object only remembers what the rule needs.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gradientmail.algorithms import schedule
from gradientmail.algorithms.align import AlignmentPlan, WorkMark
from gradientmail.backends import Backend, Tensor
from gradientmail.backends.host import HostBuffer
from gradientmail.records import Realignment
from gradientmail.session.ledger import LedgerView, StepLedger
from gradientmail.store import CommittedVersion, ContributionCounts

__all__ = ["Commit", "LearnerFragment", "Publication", "Residual"]


@dataclass(frozen=True, eq=False)
class Publication:
    """A fragment's snapshot ready to go, with the anchor its delta is taken against and the
    counts it reports. The exchange computes the delta from them on its own thread."""

    fragment: int
    anchor_version: int
    anchor: Mapping[str, np.ndarray]
    snapshot: HostBuffer
    counts: ContributionCounts
    taken_at: WorkMark = field(default_factory=WorkMark)
    """The learner's count when the snapshot was taken: where its unmerged work begins once a
    round merges this contribution."""


@dataclass(frozen=True)
class Commit:
    """A committed version fetched for alignment, as host arrays, with the exchange's decision."""

    fragment: int
    version: int
    params: dict[str, np.ndarray]
    base_version: int
    """The version the learner was aligned with when this was fetched."""
    merged: Publication | None
    """The learner's contribution the round built on ``base_version`` merged
    (:func:`~gradientmail.algorithms.align.contribution_merged`), or None: the one answer to
    "was our work merged?" that the alignment uses."""
    base_params: Mapping[str, np.ndarray] | None = None
    """The parameters of ``base_version`` as the exchange knows them (its fetch, or the
    initial anchor): the start of the correction when the commit merged nothing of ours."""
    correction: dict[str, np.ndarray] | None = None
    """θ_commit − θ_start in fp32 for the start ``merged`` implies, computed on the exchange's
    thread so that alignment only adds it in place; None when it was not expected to be needed."""
    rejected: str | None = None
    """The reason the round built on ``base_version`` rejected a contribution of ours, if it did
    (the step ledger's reason for work this commit replaces)."""

    @property
    def carry_start(self) -> Mapping[str, np.ndarray] | None:
        """Where the unmerged work this commit does not include began: the merged contribution's
        snapshot, else the base version's parameters (None when the exchange does not hold them)."""
        return self.merged.snapshot.arrays if self.merged is not None else self.base_params


@dataclass
class Residual:
    """What one contribution's codes could not carry (fp32), and whether its round merged it."""

    anchor_version: int
    arrays: dict[str, np.ndarray]
    merged: bool = False


@dataclass(eq=False)
class LearnerFragment:
    """One fragment's learner state. The training thread reads and writes the first group, the
    exchange thread the second; ``outstanding`` is written by the training thread only, and the
    hand-over fields (``held``, ``ready``) change under ``lock``."""

    index: int
    names: tuple[str, ...]
    anchor: Mapping[str, np.ndarray]
    """The committed parameters the learner is aligned with, as host arrays (never written)."""
    anchor_version: int

    # -- the training thread's side --------------------------------------------------
    anchor_step: int = 0
    """Local step at which the learner aligned with ``anchor_version``."""
    unmerged_from: WorkMark = field(default_factory=WorkMark)
    """Where the fragment's unmerged work begins (before ``anchor_step`` when work was carried
    across the alignment)."""
    outstanding: Publication | None = None
    """Our contribution against ``anchor_version`` that a round may still merge (None once
    aligned, or once the wait for its commit timed out)."""
    buffers: list[HostBuffer] = field(default_factory=list)
    """Host snapshots of this fragment, reused from publish to publish."""
    realigned: list[Realignment] = field(default_factory=list)
    """Work dropped since the last merged contribution, reported with the next one."""
    deferred: bool = False
    """Due while ``in_flight`` was exhausted: publish as soon as a slot frees."""
    half_period_pending: bool = False
    """Due with less than half a period trained (quorum of one): publish once it has that much."""
    due_step: int = 0
    """The local step at which the schedule next asks for this fragment: the staircase at first,
    then ``sync_every`` steps after each alignment (the learner follows the run's rounds)."""
    ledger: StepLedger = field(default_factory=StepLedger)
    """Where this fragment's trained steps went (``session.ledger``)."""

    # -- the exchange thread's side -----------------------------------------------------
    known_version: int = -1
    """The newest version the exchange has fetched (or the learner joined at)."""
    known_params: Mapping[str, np.ndarray] | None = None
    """The parameters of ``known_version``: the base of compact updates and of corrections."""
    held: Publication | None = None
    """The newest uploaded contribution whose round may still merge it (its snapshot is held
    while the learner carries: the start of the correction when the round merges it)."""
    residual: Residual | None = None
    """What the last contribution's codes could not carry (error feedback)."""
    awaiting: bool = False
    """An upload and no commit since: probed on every (hurried) pass."""
    published_at: dict[int, float] = field(default_factory=dict)
    """Anchor version → exchange clock when a contribution against it was handed over."""
    ready: Commit | None = None
    """The commit fetched and not yet aligned with."""
    probe_next: bool = False
    """The syncer in this process just committed this fragment: fetch it on the next pass."""
    made_here: CommittedVersion | None = None
    """The newest commit of this fragment the syncer in this process made, handed in memory."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def joined(cls, index: int, names: Sequence[str], anchor: Mapping[str, np.ndarray], version: int) -> LearnerFragment:
        """A fragment as a learner that joins at ``version`` (whose parameters are ``anchor``) holds it."""
        return cls(index, tuple(names), anchor, version, known_version=version, known_params=anchor)

    # -- the training thread -------------------------------------------------------------
    def snapshot(self, backend: Backend, live: Mapping[str, Tensor]) -> HostBuffer:
        """The fragment's parameters copied to host memory, into a buffer the exchange no longer
        reads (one device→host copy: the only work a contribution costs the training thread)."""
        busy = self.outstanding.snapshot if self.outstanding is not None else None
        for buffer in self.buffers:
            if not buffer.held and buffer is not busy:
                backend.fill_host_buffer(buffer, live, self.names)
                return buffer
        buffer = backend.new_host_buffer(live, self.names)
        if backend.reuses_host_buffers:
            self.buffers.append(buffer)  # others (MLX) are fresh arrays each time
        return buffer

    def publication(self, snapshot: HostBuffer, now: WorkMark, *, final: bool, step_time_s: float | None) -> Publication:
        """The contribution of the work since ``unmerged_from`` (at ``now``), from ``snapshot``:
        its counts say how much, how long a step took, how much was carried and what was dropped."""
        work = now.since(self.unmerged_from)
        counts = ContributionCounts(
            steps=work.steps,
            samples=work.samples,
            final=final,
            step_time_s=step_time_s,
            carried_steps=max(0, self.anchor_step - self.unmerged_from.steps),
            realigned=tuple(self.realigned),
        )
        return Publication(self.index, self.anchor_version, self.anchor, snapshot, counts, now)

    def aligned(self, commit: Commit, plan: AlignmentPlan, *, steps: int, sync_every: int) -> None:
        """Aligned with ``commit`` by ``plan`` at local step ``steps`` (the model written): the work
        to report as dropped, the new anchor, and the step the schedule next asks for it."""
        merged = commit.merged
        if merged is not None:
            self.realigned.clear()  # the merged contribution reported them
        reason = "carry_limit" if plan.dropped is not None else "not_carried" if merged else commit.rejected or "superseded"
        self.ledger.aligned(
            unmerged_before=self.unmerged_from.steps,
            unmerged_after=plan.unmerged_from.steps,
            merged_at=merged.taken_at.steps if merged is not None else None,
            reason=reason,
        )
        if plan.dropped is not None:
            dropped = plan.dropped
            self.realigned.append(
                Realignment(steps=dropped.steps, samples=dropped.samples, reason="carry_limit", at_version=commit.version)
            )
        self.unmerged_from = plan.unmerged_from
        self.anchor, self.anchor_version, self.anchor_step = commit.params, commit.version, steps
        self.outstanding = None
        self.due_step = schedule.next_due(steps, merged.taken_at.steps if merged is not None else None, sync_every)
        self.half_period_pending = False

    def closed(self, now: WorkMark) -> int:
        """The session closes with the model set back to a commit: the unmerged work is dropped
        (``at_close``); returns its steps."""
        dropped = now.since(self.unmerged_from).steps
        self.ledger.drop(dropped, "at_close")
        self.unmerged_from = now
        return dropped

    def ledger_view(self, steps: int) -> LedgerView:
        """This fragment's step ledger at ``steps`` trained."""
        return self.ledger.view(trained=steps, unmerged_from=self.unmerged_from.steps, anchor_step=self.anchor_step)

    # -- the exchange thread -------------------------------------------------------------
    def hold(self, publication: Publication, *, carry: bool) -> None:
        """An upload of ``publication`` begins: it replaces the previous one as the contribution a
        round may merge when it is against our newest version (its snapshot stays held while the
        learner carries), and frees the previous snapshot."""
        with self.lock:
            previous, self.held = self.held, None
            if previous is not None:
                previous.snapshot.held = False
            if publication.anchor_version >= self.known_version:
                self.held = publication
                publication.snapshot.held = carry
            else:
                publication.snapshot.held = False

    def commit_made_here(self, committed: CommittedVersion | None) -> None:
        """The syncer in this process committed this fragment (on its thread): fetch it on the
        exchange's next pass, taking ``committed`` (its record and parameters as written) instead
        of reading them back."""
        with self.lock:
            self.probe_next = True
            if committed is not None:
                self.made_here = committed

    def take_probe(self) -> bool:
        """Whether a commit made here waits to be fetched (once)."""
        if not self.probe_next:  # the common case, without the lock
            return False
        with self.lock:
            probe, self.probe_next = self.probe_next, False
        return probe

    def take_handed(self) -> CommittedVersion | None:
        """The commit made here, handed in memory, if one waits (once)."""
        with self.lock:
            handed, self.made_here = self.made_here, None
        return handed

    def offer(self, commit: Commit) -> None:
        """A fetched commit is ready to align with (replacing one not yet taken)."""
        with self.lock:
            self.ready = commit

    def take(self) -> Commit | None:
        """The commit ready to align with, if any; the snapshot of the round it ends stops being
        held (the learner aligns with it now)."""
        if self.ready is None:  # the common case, without the lock
            return None
        with self.lock:
            commit, self.ready = self.ready, None
            held = self.held
            if commit is not None and held is not None and held.anchor_version < commit.version:
                self.held = None
                held.snapshot.held = False
        return commit

    def release(self) -> None:
        """The exchange stops: nothing is held any more."""
        with self.lock:
            if self.held is not None:
                self.held.snapshot.held = False
                self.held = None
