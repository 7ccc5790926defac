"""What a learner tells the others of its progress: its step time, its lease's info, the
schedule the exchange paces by. Pure functions of the learner's counters, read from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gradientmail.session.fragment import LearnerFragment
from gradientmail.session.ledger import LedgerView
from gradientmail.session.looking import LearnerSchedule
from gradientmail.session.transfer_meter import LINK, LinkReading
from gradientmail.store import TRAINING
from gradientmail.syncer.assignment import CLOSES

__all__ = ["LEDGER", "StepTimer", "lease_info", "learner_schedule"]

LEDGER = "ledger"
"""The lease info key of the learner's step ledger: one ``LedgerView.as_json()`` per fragment."""


@dataclass
class StepTimer:
    """The learner's step time: an exponential moving average of the gaps between steps."""

    smoothing: float
    """The weight of the newest gap (``SessionOptions.step_time_smoothing``)."""
    step_time_s: float | None = None
    """None before the second step."""
    _last_at: float | None = None

    def stepped(self, now: float) -> None:
        if self._last_at is not None:
            gap, a = now - self._last_at, self.smoothing
            self.step_time_s = gap if self.step_time_s is None else (1 - a) * self.step_time_s + a * gap
        self._last_at = now


def lease_info(
    *,
    steps: int,
    step_time_s: float | None,
    versions: Sequence[int],
    elects: bool,
    serving: bool,
    next_due: int | None,
    ledger: Sequence[LedgerView] = (),
    link: LinkReading | None = None,
) -> dict[str, object]:
    """Progress shown in a learner's lease (read by the CLI and telemetry), and when its next
    contribution is due: ``due_in_s``, seconds from the renewal at its current step time (the
    elected syncer lists contributions at the regular pace around then; a hint only, absent
    before the step time is known and once the contribution is due). ``next_due``: None while
    the session is not open. ``ledger``: each fragment's step ledger (``gradientmail status``
    prints it). ``link``: what share of a sync period its transfers need
    (``session.transfer_meter``; ``gradientmail status`` says when the link is the bottleneck)."""
    info: dict[str, object] = {
        "step": steps,
        "step_time_s": round(step_time_s or 0.0, 6),
        "versions": ",".join(str(v) for v in versions),
    }
    if ledger:
        info[LEDGER] = [view.as_json() for view in ledger]
    if link is not None:
        info[LINK] = link.as_info()
    if elects:
        info[CLOSES] = True  # it runs a syncer: a spread run may give it fragments to close
    if serving:
        info[TRAINING] = False
        return info
    if next_due is not None and step_time_s and next_due > steps:
        # absent once due: the contribution is on its way (the window of an earlier renewal
        # covers its upload) or waits for a slot; the syncer keeps no fast pace for it
        info["due_in_s"] = round((next_due - steps) * step_time_s, 3)
    return info


def learner_schedule(
    fragments: Sequence[LearnerFragment], steps: int, step_time_s: float | None, sync_every: int
) -> LearnerSchedule:
    """Where a learner's schedule is, for the exchange's pace (``session.looking``): its sync
    period and each fragment's next scheduled publish at the current step time."""
    if not step_time_s:
        return LearnerSchedule()
    return LearnerSchedule(
        period_s=sync_every * step_time_s,
        due_in_s=tuple(None if f.outstanding is not None else max(0.0, (f.due_step - steps) * step_time_s) for f in fragments),
        due_steps=tuple(f.due_step for f in fragments),
    )
