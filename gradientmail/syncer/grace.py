"""The adaptive grace window of Decoupled DiLoCo.

After a round reaches quorum the syncer waits a little longer for more reports, but only
as long as the learners have slack to spare:

    grace = min(grace_max_s, γ · max(0, τ·ξ_step − (ξ_quorum + ξ_sync)))

* ξ_step — seconds per learner step: each contribution carries its learner's own
  exponentially smoothed step time; the syncer takes the median over the round's accepted
  contributions and smooths it again across rounds (EMA, weight ``smoothing``).
* ξ_quorum — seconds from the first accepted contribution of the round to quorum.
* ξ_sync — seconds the syncer needs to fetch, merge, write and commit: the EMA of the
  measured duration of its previous rounds (0 before the first).
* τ (``grace_tau``, default 2) — learner steps a round may take, the overlap the learners
  train through; γ (``grace_gamma``, default 0.2) — the share of the remaining slack spent.

The window only spends slack that exists, so no learner is made to wait by it. Reported
step times are clamped before they count (INV-12): to ``grace_max_s / τ`` (a longer step
time could only pin the window at its cap) and, once an estimate exists, to
``STEP_TIME_GROWTH`` × that estimate, so one learner reporting 10³⁰⁸ s moves the estimate by a
bounded factor per round instead of pinning every later window at ``grace_max_s``.

The slack formula only sees step time. When steps are short next to the mailbox's round trip
(13 ms steps, H = 20, a directory or S3 between processes) it gives a window of ~0, the learner
beside the syncer closes every round alone and the others' contributions come stale. Two other
rules (``DiLoCo.grace_rule``) size the wait from what happens instead:

* ``arrivals`` — the window is at least the 90th percentile of how late contributions arrived
  after their round reached quorum, over the last ``ARRIVALS_KEPT`` seen (those that made the
  round, at their lateness; those that came after it closed, stale, at theirs), plus the
  syncer's poll interval, up to ``grace_periods`` round periods (``sync_every`` × ξ_step);
* ``live`` — the window is ``grace_periods`` round periods, so the round waits for every live
  learner unless one is far slower than the rest.

Whatever the rule, the runtime ends the wait as soon as every live learner is in.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gradientmail.algorithms.diloco import GraceRule

STEP_TIME_GROWTH = 2.0
"""Most a reported step time may exceed the current estimate by before it counts."""
ARRIVALS_KEPT = 32
"""Lateness samples the ``arrivals`` rule keeps (about eight rounds of four learners)."""
ARRIVALS_QUANTILE = 0.9


@dataclass
class GraceEstimator:
    gamma: float = 0.2
    tau: float = 2.0
    max_s: float = 60.0
    smoothing: float = 0.3
    step_time_s: float | None = None
    sync_s: float = 0.0
    rule: GraceRule = "slack"
    periods: float = 1.0
    """With ``arrivals`` or ``live``: the longest window, in round periods."""
    sync_every: int = 1
    """H, the steps of a round period."""
    margin_s: float = 0.0
    """Added to the ``arrivals`` quantile: the syncer's poll interval (how late it may notice)."""
    lateness_s: deque[float] = field(default_factory=lambda: deque(maxlen=ARRIVALS_KEPT))
    """How late recent contributions arrived after their round reached quorum (0: before it)."""

    def observe_step_times(self, reported: Iterable[float | None]) -> None:
        ceiling = self.max_s / self.tau if self.tau > 0 else self.max_s
        if self.step_time_s is not None:
            ceiling = min(ceiling, STEP_TIME_GROWTH * self.step_time_s)
        values = [min(v, ceiling) for v in reported if v is not None and math.isfinite(v) and v > 0]
        if values:
            self.step_time_s = self._smooth(self.step_time_s, statistics.median(values))

    def observe_sync(self, seconds: float) -> None:
        self.sync_s = self._smooth(self.sync_s if self.sync_s > 0 else None, seconds)

    def observe_lateness(self, seconds: float) -> None:
        """A contribution arrived ``seconds`` after its round reached quorum (0 or less: before)."""
        if math.isfinite(seconds):
            self.lateness_s.append(max(0.0, seconds))

    def window(self, quorum_wait_s: float) -> float:
        """The grace window in seconds for a round that took ``quorum_wait_s`` to reach quorum."""
        if self.step_time_s is None:
            return 0.0
        slack = self.tau * self.step_time_s - (quorum_wait_s + self.sync_s)
        window = self.gamma * max(0.0, slack)
        cap = self.periods * self.sync_every * self.step_time_s
        if self.rule == "live":
            window = max(window, cap)
        elif self.rule == "arrivals" and self.lateness_s:
            late = sorted(self.lateness_s)[min(len(self.lateness_s) - 1, int(ARRIVALS_QUANTILE * len(self.lateness_s)))]
            if late > 0:
                window = max(window, min(cap, late + self.margin_s))
        return min(self.max_s, window)

    def _smooth(self, previous: float | None, value: float) -> float:
        return value if previous is None else (1 - self.smoothing) * previous + self.smoothing * value
