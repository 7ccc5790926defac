"""When a learner looks for news: the pace of its exchange, from its own schedule.

The rules (docs/session.md, "Polling"), apart from the exchange that follows them, so that a fake
clock pins them:

* a fragment whose commit the learner awaits (it published) is probed at ``poll_interval_s``,
  sooner in a hurry: that cost is per round;
* every other fragment is looked at once per ``algorithms.schedule.look_interval``: a tenth of
  the learner's sync period (``sync_every`` × its step time), never faster than ``poll_interval_s`` nor slower than
  the idle interval (a third of the lease TTL), and at the idle interval while it does not train.
  A look is one read of the elected syncer's bulletin (``store.bulletin``), or none when the node
  holds the election or its election watch just read the lease;
* a fragment about to be due is probed once, :func:`due_lead_s` before its scheduled publish, so
  its contribution goes out on the newest version rather than one a commit just replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DUE_LEAD_POLLS", "LearnerSchedule", "due_lead_s"]

DUE_LEAD_POLLS = 2
"""How many poll intervals before a fragment's scheduled publish its head is probed."""


@dataclass(frozen=True)
class LearnerSchedule:
    """What the training thread's schedule says, as the exchange reads it."""

    period_s: float | None = None
    """Seconds of one sync period at the current step time; None while no step time is known
    (before the second step, or while the learner does not train)."""
    due_in_s: tuple[float | None, ...] = ()
    """Per fragment, seconds until its next scheduled publish; None when none is pending (one
    is out, or no step time is known)."""
    due_steps: tuple[int, ...] = ()
    """Per fragment, the step of that publish: which due event a probe was for."""


def due_lead_s(poll_interval_s: float) -> float:
    """Seconds before a scheduled publish that its fragment's head is probed."""
    return DUE_LEAD_POLLS * poll_interval_s
