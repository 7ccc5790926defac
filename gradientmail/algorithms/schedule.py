"""When a learner publishes a fragment: the rules of the learner's schedule, as pure functions.

The staircase itself (which fragment is due at which step) is in
:mod:`gradientmail.algorithms.fragments`. The rules here decide what a due fragment does:

* **Half a period.** Every round applies a full outer momentum step, so a learner whose
  schedule falls just after it aligned must not open a round of a few steps. A scheduled
  exchange needs ⌈H/2⌉ steps trained since the fragment aligned. With ``quorum_size ≥ 2`` a
  learner short of that skips the exchange (the next round pulls it in early); with a
  quorum of one nothing would, so it publishes once it reaches the half period.
* **In flight.** With ``in_flight`` set, a learner holds at most that many published,
  uncommitted fragments; a due fragment beyond that is deferred until a slot frees.
* **Overlap.** With ``overlap_steps`` set, a learner trains at most that many steps past a
  publish before it waits for the commit.
"""

from __future__ import annotations

from enum import Enum

from gradientmail.algorithms.fragments import exchange_offset

__all__ = ["OnSchedule", "due_by_offset", "half_period", "must_wait_for_commit", "on_schedule", "slot_free"]


class OnSchedule(Enum):
    """What a fragment does at its scheduled step."""

    PUBLISH = "publish"
    PUBLISH_AT_HALF_PERIOD = "publish_at_half_period"
    """Short of half a period with a quorum of one: publish once it has trained that much."""
    SKIP = "skip"
    """Short of half a period with a larger quorum: the next round pulls it in early."""


def due_by_offset(fragments: int, sync_every: int) -> dict[int, tuple[int, ...]]:
    """Fragments keyed by the step within a period (``step % sync_every``) at which they are due."""
    due: dict[int, list[int]] = {}
    for fragment in range(fragments):
        due.setdefault(exchange_offset(fragment, fragments, sync_every), []).append(fragment)
    return {offset: tuple(members) for offset, members in due.items()}


def half_period(sync_every: int) -> int:
    """⌈H/2⌉: the least training since a fragment aligned that a scheduled publish carries."""
    return (sync_every + 1) // 2


def on_schedule(steps_since_align: int, sync_every: int, quorum_size: int) -> OnSchedule:
    """The rule for a fragment at its scheduled step."""
    if steps_since_align >= half_period(sync_every):
        return OnSchedule.PUBLISH
    return OnSchedule.PUBLISH_AT_HALF_PERIOD if quorum_size == 1 else OnSchedule.SKIP


def slot_free(published_fragments: int, in_flight: int | None) -> bool:
    """Whether another fragment may be published with ``published_fragments`` uncommitted."""
    return in_flight is None or published_fragments < in_flight


def must_wait_for_commit(steps_since_publish: int, overlap_steps: int | None) -> bool:
    """Whether the learner must wait for the commit of a fragment it published that long ago."""
    return overlap_steps is not None and steps_since_publish >= overlap_steps
