"""The training thread's side of an open run: publish what is due, align with what is ready.

``OpenRun`` is everything that exists only between ``Session.open()`` and ``close()``: the
run's spec, the learner's fragments (one ``LearnerFragment`` each), the node's background
loops, and the rules the training thread applies between two steps — the schedule's
(``session.due``), the alignment's (``algorithms.align``, written into the model by
``write_alignment``), the waits' (``session.waits``). ``Session`` counts steps, owns the
lifecycle and the public API, and calls it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gradientmail.algorithms import align, schedule
from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends import Backend, Tensor
from gradientmail.session import due
from gradientmail.session.fragment import Commit, LearnerFragment
from gradientmail.session.join import newest_readable
from gradientmail.session.node_loops import NodeLoops
from gradientmail.session.progress import StepTimer
from gradientmail.session.waits import CommitWaits, SyncerWatch
from gradientmail.store import RunSpec, RunStore

__all__ = ["FLUSH_ATTEMPTS", "OpenRun", "write_alignment"]

FLUSH_ATTEMPTS = 3
"""Final contributions published at close when a round closes without the previous ones."""

Emit = Callable[..., None]
"""``emit(kind, fragment=…, version=…)``: a ``SessionEvent`` for the listeners (``EventKind``)."""


@dataclass(eq=False)
class OpenRun:
    """One open run of a learner (module docstring). ``stats`` is the session's ``SessionStats``."""

    spec: RunSpec
    fragments: list[LearnerFragment]
    loops: NodeLoops
    backend: Backend
    model: Any
    algorithm: DiLoCo
    stats: Any
    timer: StepTimer
    learner_id: str
    options: Any
    """The session's ``SessionOptions`` (``commit_timeout_s``, ``poll_interval_s``)."""
    changed: threading.Condition
    """Notified when the exchange has news: what the waits wait on."""
    clock: Callable[[], float]
    fresh: Callable[[Sequence[str]], None]
    """Before the model's parameters are read (rank 0 of an FSDP group gathers them)."""
    emit: Emit
    store: RunStore
    """The run's store (the room wait watches its syncer lease)."""
    next_due: int = 0
    """The earliest ``due_step`` of any fragment (the lease's ``due_in_s``)."""
    next_check: int = 0
    """``next_due``, or earlier the step an outstanding contribution makes the learner wait at
    (``due.next_wait``): what ``step()`` compares against."""
    open: bool = True
    """False once closed; the rest stays readable (byte counts, the spec)."""

    def __post_init__(self) -> None:
        self.rescheduled()
        self.waits = CommitWaits(
            self.learner_id,
            commit_timeout_s=self.options.commit_timeout_s,
            poll_interval_s=self.options.poll_interval_s,
            changed=self.changed,
            align_ready=self.align_ready,
            stats=self.stats,
            clock=self.clock,
        )
        self.watch = SyncerWatch(self.store, self.spec.lease_ttl_s, self.options.poll_interval_s, self.clock)
        """Whether a live syncer exists to make the commit a wait is for: a run without one
        (every syncer gone past a takeover) does not keep the learner waiting."""

    def rescheduled(self) -> None:
        """The fragments' marks moved: when ``step()`` next calls ``between_steps``."""
        self.next_due = due.next_due(self.fragments)
        waits_at = due.next_wait(self.fragments, self.algorithm.overlap_steps, self.spec.carry_room_steps)
        self.next_check = self.next_due if waits_at is None else min(self.next_due, waits_at)

    # -- between steps -------------------------------------------------------------
    def between_steps(self) -> bool:
        """Align with what is ready, publish what is due, wait where ``overlap_steps`` says.
        True: check again at the next step (a count of steps decides something)."""
        exchange = self.loops.exchange
        if exchange.failure is not None:
            raise exchange.failure
        self.align_ready()
        steps = self.stats.steps
        for fragment in due.due_now(self.fragments, steps, self.algorithm, exchange.looking.open_rounds):
            self.publish(fragment, final=False)
        self.rescheduled()
        for state in self.fragments:
            if due.must_wait_for_commit(state, self.stats.steps, self.algorithm.overlap_steps, self.spec.carry_room_steps):
                self.waits.for_commit(state, watch=self.watch)
                self.rescheduled()
        return due.keeps_attention(self.fragments, self.algorithm, exchange.looking.open_rounds)

    def changed_since(self, versions_before: Sequence[int]) -> list[str]:
        """The parameters of the fragments aligned since ``versions_before``, sorted."""
        changed = [i for i, version in enumerate(self.stats.versions) if version != versions_before[i]]
        return sorted(name for i in changed for name in self.fragments[i].names)

    def align_ready(self) -> None:
        for commit in self.loops.exchange.take_ready().values():
            self.align(commit)

    def align(self, commit: Commit) -> None:
        """Align a fragment with a commit, by the plan of ``align.plan_alignment`` on the
        exchange's decision of whether the commit merged our contribution (``commit.merged``)."""
        state, stats = self.fragments[commit.fragment], self.stats
        if commit.version <= state.anchor_version:
            return
        merged = commit.merged
        plan = align.plan_alignment(
            carry=self.algorithm.carry_unmerged,
            merged_at=merged.taken_at if merged is not None else None,
            unmerged_from=state.unmerged_from,
            now=align.WorkMark(stats.steps, stats.samples),
            anchor_step=state.anchor_step,
            versions_ahead=commit.version - state.anchor_version,
            carry_limit_steps=self.algorithm.carry_limit_steps,
            room_steps=self.spec.carry_room_steps,
        )
        write_alignment(self.backend, self.model, self.algorithm, state, commit, plan.action, fresh=self.fresh)
        state.aligned(commit, plan, steps=stats.steps, sync_every=self.algorithm.sync_every)
        self.rescheduled()
        stats.alignments += 1
        stats.versions[commit.fragment] = commit.version
        self.emit("aligned", fragment=commit.fragment, version=commit.version)

    def publish(self, fragment: int, *, final: bool, flush: bool = False) -> None:
        """Hand the fragment's unmerged work to the exchange, unless there is none, one is out
        already, or ``in_flight`` has no slot (then it is ``deferred``; ``final`` and ``flush``
        publish anyway)."""
        state = self.fragments[fragment]
        now = align.WorkMark(self.stats.steps, self.stats.samples)
        if now.since(state.unmerged_from).steps == 0 or state.outstanding is not None:
            state.deferred = False
            return
        busy = sum(1 for f in self.fragments if f.outstanding is not None)
        if not (final or flush) and not schedule.slot_free(busy, self.algorithm.in_flight):
            state.deferred = True
            return
        state.deferred = False
        self.fresh(state.names)
        snapshot = state.snapshot(self.backend, dict(self.backend.named_parameters(self.model)))
        state.outstanding = state.publication(snapshot, now, final=final, step_time_s=self.timer.step_time_s)
        self.loops.exchange.publish(state.outstanding)
        state.half_period_pending = False
        self.stats.contributions += 1
        self.emit("published", fragment=fragment, version=state.anchor_version)

    def hand_over(self) -> None:
        """Publish every fragment's unmerged work and wait for its rounds (an ``"either"`` node
        about to serve as the syncer)."""
        deadline = self.waits.deadline()
        for fragment in range(len(self.fragments)):
            self.publish(fragment, final=False, flush=True)
        self.waits.for_outstanding(self.fragments, deadline)

    # -- closing -------------------------------------------------------------------
    def finish_rounds(self, store: RunStore) -> None:
        """Wait for the rounds our contributions are in (no longer than a live syncer exists to
        commit them); with ``flush_on_close`` publish the unmerged work first, and while
        carrying, again if a round closed without it."""
        carry, flush = self.algorithm.carry_unmerged, self.algorithm.flush_on_close
        deadline = self.waits.deadline()
        watch = SyncerWatch(store, self.spec.lease_ttl_s, self.options.poll_interval_s, self.clock)
        for _ in range(FLUSH_ATTEMPTS if flush and carry else 1):
            if flush:
                for fragment in range(len(self.fragments)):
                    self.publish(fragment, final=True)
            self.waits.for_outstanding(self.fragments, deadline, watch)
            if all(state.unmerged_from.steps == self.stats.steps for state in self.fragments):
                return

    def load_newest(self, store: RunStore) -> None:
        """Set the model to each fragment's newest commit (the steps since the last contribution
        are dropped, counted in ``dropped_at_close``)."""
        stats = self.stats
        for fragment, state in enumerate(self.fragments):
            stats.dropped_at_close[fragment] = state.closed(align.WorkMark(stats.steps, stats.samples))
            newest = store.newest_version(fragment, known=state.anchor_version)
            if newest is not None and newest > state.anchor_version:
                record, params = newest_readable(store, self.spec, fragment)  # a deleted blob: one back (INV-21)
                newest = record.version
            if newest is not None and newest > state.anchor_version:
                self.backend.write_parameters(self.model, tensors(self.backend, params))
                state.anchor, state.anchor_version = params, newest
                stats.versions[fragment] = newest
            else:  # drop the steps since the last contribution: back to the committed anchor
                self.backend.write_parameters(self.model, tensors(self.backend, state.anchor))


def tensors(backend: Backend, arrays: Mapping[str, Any]) -> dict[str, Tensor]:
    return {name: backend.from_numpy(array) for name, array in arrays.items()}


def write_alignment(
    backend: Backend,
    model: Any,
    algorithm: DiLoCo,
    state: LearnerFragment,
    commit: Commit,
    action: align.AlignAction,
    *,
    fresh: Callable[[Sequence[str]], None],
) -> None:
    """Write the model's side of an alignment: the commit (blended under ``mixing`` when not
    carrying), or the commit with the unmerged work carried onto it, θ ← θ + (θ_commit − θ_start),
    adding the correction the exchange computed (or computing it here when it has none)."""
    replaces = algorithm.carry_unmerged or algorithm.mixing == 0
    if action is align.AlignAction.CARRY or not replaces:
        fresh(state.names)  # the local work is read
    if action is align.AlignAction.CARRY:
        correction = commit.correction
        if correction is None:
            start = commit.carry_start if commit.carry_start is not None else state.anchor
            correction = align.carry_correction(commit.params, start)
        backend.add_in_place(model, correction)
    elif replaces:
        backend.write_parameters(model, tensors(backend, commit.params))
    else:  # the guide's behaviour with mixing: the commit blends with the local work
        local = backend.read_parameters(model, state.names)
        aligned = align.aligned_parameters(backend, local, tensors(backend, commit.params), algorithm.mixing)
        backend.write_parameters(model, aligned)
