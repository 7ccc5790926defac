"""When a learner publishes a fragment: the rules of the learner's schedule, as pure functions.

The staircase itself (which fragment is due at which step of a period) is in
:mod:`gradientmail.algorithms.fragments`; a learner follows it from the step it joins, and
after each alignment counts the period from its merged publish or the alignment (:func:`next_due`).
The rules here decide when a fragment is due and what a due fragment does:

* **Half a period.** Every round applies a full outer momentum step, so a learner whose
  schedule falls just after it aligned must not open a round of a few steps. A scheduled
  exchange needs ⌈H/2⌉ steps trained since the fragment aligned. With ``quorum_size ≥ 2`` a
  learner short of that skips the exchange (the next round pulls it in early); with a
  quorum of one nothing would, so it publishes once it reaches the half period.
* **Open rounds.** A learner that sees a round other learners opened on its version joins it
  early (see :func:`joins_open_round`).
* **In flight.** With ``in_flight`` set, a learner holds at most that many published,
  uncommitted fragments; a due fragment beyond that is deferred until a slot frees.
* **Overlap.** With ``overlap_steps`` set, a learner trains at most that many steps past a
  publish before it waits for the commit.
* **Pace.** What happens between rounds is looked for at a pace set by the sync period
  (:func:`look_interval`), by learners and by the syncer alike: a fixed number of looks per
  period, between the poll and the idle interval.
"""

from __future__ import annotations

from enum import Enum

from gradientmail.algorithms.fragments import exchange_offset

__all__ = [
    "OnSchedule",
    "first_due_step",
    "half_period",
    "joins_open_round",
    "look_interval",
    "LOOKS_PER_PERIOD",
    "must_wait_for_commit",
    "overlap_bound",
    "next_due",
    "on_schedule",
    "slot_free",
]


class OnSchedule(Enum):
    """What a fragment does at its scheduled step."""

    PUBLISH = "publish"
    PUBLISH_AT_HALF_PERIOD = "publish_at_half_period"
    """Short of half a period with a quorum of one: publish once it has trained that much."""
    SKIP = "skip"
    """Short of half a period with a larger quorum: the next round pulls it in early."""


def first_due_step(fragment: int, fragments: int, sync_every: int) -> int:
    """The step of a learner's first exchange of ``fragment``: its place on the staircase."""
    return exchange_offset(fragment, fragments, sync_every) or sync_every


def next_due(aligned_at: int, merged_publish: int | None, sync_every: int) -> int:
    """The step of a fragment's next exchange after it aligned with a commit at ``aligned_at``.

    If the commit merged the contribution the learner published at ``merged_publish``, the
    learner was in that round: its period goes on from the publish, so its rounds do not slip
    by the steps a commit takes to arrive. If not (it was late, or had not published), it
    counts the period from the alignment: every learner aligns with a commit within a poll of
    the others, so a learner that started apart or fell behind joins the others' rounds
    after one commit, where counting ``step % sync_every`` would keep it apart for the run.
    """
    return (merged_publish if merged_publish is not None else aligned_at) + sync_every


def half_period(sync_every: int) -> int:
    """⌈H/2⌉: the least training since a fragment aligned that a scheduled publish carries."""
    return (sync_every + 1) // 2


def on_schedule(steps_since_align: int, sync_every: int, quorum_size: int) -> OnSchedule:
    """The rule for a fragment at its scheduled step."""
    if steps_since_align >= half_period(sync_every):
        return OnSchedule.PUBLISH
    return OnSchedule.PUBLISH_AT_HALF_PERIOD if quorum_size == 1 else OnSchedule.SKIP


def joins_open_round(steps_since_align: int, sync_every: int, quorum_size: int) -> bool:
    """Whether a fragment publishes early into a round other learners have opened.

    With ``quorum_size ≥ 2`` the round waits one short of quorum, so any trained step joins it.
    With a quorum of one the round is already closing: only a fragment with half a period
    trained joins (inside the grace window), so no round gains a contribution of a few steps.
    """
    if steps_since_align <= 0:
        return False
    return quorum_size >= 2 or steps_since_align >= half_period(sync_every)


def slot_free(published_fragments: int, in_flight: int | None) -> bool:
    """Whether another fragment may be published with ``published_fragments`` uncommitted."""
    return in_flight is None or published_fragments < in_flight


def overlap_bound(overlap_steps: int | None, room_steps: int) -> int:
    """The most steps a learner trains past a publish before it waits for the commit:
    ``overlap_steps``, and never more than its next contribution can hold (``room_steps``,
    ``RunSpec.carry_room_steps``), since work trained past that would be dropped at the
    alignment (``align.plan_alignment``): a commit that long in coming (a syncer takeover when
    steps are short) costs the learner idle time instead of trained work thrown away."""
    return room_steps if overlap_steps is None else min(overlap_steps, room_steps)


def must_wait_for_commit(steps_since_publish: int, overlap_steps: int | None, room_steps: int) -> bool:
    """Whether the learner must wait for the commit of a fragment it published that long ago."""
    return steps_since_publish >= overlap_bound(overlap_steps, room_steps)


LOOKS_PER_PERIOD = 10
"""Looks per sync period: a round another learner opened, a commit, a contribution the syncer
expects are each seen within a tenth of the period that produced them (a ``live`` grace window
waits a whole one)."""


def look_interval(poll_interval_s: float, idle_interval_s: float, period_s: float | None) -> float:
    """Seconds between two looks for what a sync period of ``period_s`` seconds brings: a tenth
    of it, never faster than ``poll_interval_s`` nor slower than ``idle_interval_s`` (the idle
    interval when no period is known: no step time yet, or not training)."""
    if period_s is None or period_s <= 0:
        return idle_interval_s
    return min(idle_interval_s, max(poll_interval_s, period_s / LOOKS_PER_PERIOD))
