"""Which fragments a learner publishes now: the schedule's rules over its fragments, pure.

``algorithms.schedule`` says what happens to one fragment at a step (publish at its scheduled
step, or at half a period with a quorum of one; join a round others opened; wait for a commit
under ``overlap_steps`` or at the room of the next contribution); these functions apply them
to a learner's fragments and keep the per-fragment marks (``due_step``,
``half_period_pending``) on each ``LearnerFragment``. The session calls them between steps and
does the publishing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gradientmail.algorithms import schedule
from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.session.fragment import LearnerFragment

__all__ = ["due_now", "joining", "keeps_attention", "must_wait_for_commit", "next_due", "next_wait", "scheduled_now"]


def next_due(fragments: Sequence[LearnerFragment]) -> int:
    """The earliest step any fragment is due at: what ``step()`` compares against."""
    return min(f.due_step for f in fragments)


def scheduled_now(fragments: Sequence[LearnerFragment], steps: int, algorithm: DiLoCo) -> set[int]:
    """Fragments to publish by the schedule at ``steps``; each one due moves its ``due_step`` to
    the same step of the next period (a quorum of one with less than half a period trained
    marks it ``half_period_pending`` instead)."""
    every = algorithm.sync_every
    due: set[int] = set()
    for fragment, state in enumerate(fragments):
        if state.due_step > steps:
            continue
        state.due_step += every * (1 + (steps - state.due_step) // every)
        action = schedule.on_schedule(steps - state.unmerged_from.steps, every, algorithm.quorum_size)
        if action is schedule.OnSchedule.PUBLISH:
            due.add(fragment)
        elif action is schedule.OnSchedule.PUBLISH_AT_HALF_PERIOD:
            state.half_period_pending = True
    half = schedule.half_period(every)
    due.update(i for i, f in enumerate(fragments) if f.half_period_pending and steps - f.unmerged_from.steps >= half)
    return due


def joining(fragments: Sequence[LearnerFragment], steps: int, algorithm: DiLoCo, open_rounds: Mapping[int, int]) -> set[int]:
    """Fragments to publish early into rounds other learners have opened on our anchor
    (``open_rounds``: fragment → the base version of its open round)."""
    every, quorum = algorithm.sync_every, algorithm.quorum_size
    return {
        fragment
        for fragment, version in open_rounds.items()
        if version == fragments[fragment].anchor_version
        and schedule.joins_open_round(steps - fragments[fragment].unmerged_from.steps, every, quorum)
    }


def due_now(fragments: Sequence[LearnerFragment], steps: int, algorithm: DiLoCo, open_rounds: Mapping[int, int]) -> list[int]:
    """Every fragment to publish between this step and the next, in order: scheduled, joining
    an open round, or deferred for a free ``in_flight`` slot."""
    deferred = {i for i, f in enumerate(fragments) if f.deferred}
    return sorted(scheduled_now(fragments, steps, algorithm) | joining(fragments, steps, algorithm, open_rounds) | deferred)


def must_wait_for_commit(state: LearnerFragment, steps: int, overlap_steps: int | None, room_steps: int) -> bool:
    """Whether to wait for the commit of the fragment's contribution now (``schedule.overlap_bound``)."""
    out = state.outstanding
    return out is not None and schedule.must_wait_for_commit(steps - out.taken_at.steps, overlap_steps, room_steps)


def next_wait(fragments: Sequence[LearnerFragment], overlap_steps: int | None, room_steps: int) -> int | None:
    """The earliest step a fragment's outstanding contribution makes the learner wait at, or
    None: the other step ``step()`` compares against."""
    bound = schedule.overlap_bound(overlap_steps, room_steps)
    waits = [f.outstanding.taken_at.steps + bound for f in fragments if f.outstanding is not None]
    return min(waits, default=None)


def keeps_attention(fragments: Sequence[LearnerFragment], algorithm: DiLoCo, open_rounds: Mapping[int, int]) -> bool:
    """Whether the learner checks again at every step: while a count of steps decides
    something (a wait under ``overlap_steps``, a deferred or half-period publish, joining an
    open round); a commit arriving notifies by itself."""
    waits = algorithm.overlap_steps is not None
    return bool(open_rounds) or any(
        (waits and f.outstanding is not None) or f.deferred or f.half_period_pending for f in fragments
    )
