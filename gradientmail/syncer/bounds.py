"""Bounds that keep one contribution from steering a round, learned from the run's own history.

A writer without the run key (or a learner gone wrong) can report any counts and any delta.
The syncer bounds both by robust statistics — medians, which a minority cannot move — over
the contributions it accepted in recent rounds of the fragment:

* samples per step: at most ``SAMPLES_PER_STEP_RATIO`` × the median samples/steps; beyond
  it samples are capped for the weight (the cap is in the round record; replay applies it);
* delta norm: at most ``NORM_RATIO`` × the median norm (× steps / median steps when larger);
  beyond it the contribution is rejected as ``outlier``. The ratio is wide on purpose: honest
  learners pulling different ways on different data were measured 6× apart within one round
  of the chaos benchmark's toy model; what it must stop is the 10³–10³⁸× delta of an attack.

Both need ``MIN_HISTORY`` contributions of history before they apply. From the first round,
and always as an outer bound that no history can raise, a delta's norm may be at most
``PARAMETER_NORM_RATIO`` × the norm of the fragment's committed parameters (at least
``PARAMETER_NORM_FLOOR`` × √elements, for a fragment initialised at zero): a contribution that
moves the fragment a hundred times its own length is not training, and that stops the
10⁴–10³⁸ deltas before any history exists, or once forged history has inflated the median.
A syncer that takes over seeds the history from the
newest round records (as many as it takes to reach ``MIN_HISTORY`` participants, at most
``SEED_ROUNDS``), whose participants carry their norms.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gradientmail.records import Participant

__all__ = [
    "MIN_HISTORY",
    "NORM_RATIO",
    "PARAMETER_NORM_FLOOR",
    "PARAMETER_NORM_RATIO",
    "SAMPLES_PER_STEP_RATIO",
    "SEED_ROUNDS",
    "ContributionHistory",
]

SAMPLES_PER_STEP_RATIO = 8.0
"""A learner may report up to this many times the run's median samples per step (bigger batches
are legitimate; a weight of 10³⁰⁰ is not): at most 64× the median weight per step."""
NORM_RATIO = 25.0
"""A delta may be up to this many times the median norm (times steps / median steps)."""
PARAMETER_NORM_RATIO = 100.0
"""A delta may be at most this many times the norm of the fragment's committed parameters."""
PARAMETER_NORM_FLOOR = 0.1
"""The parameters' norm counts as at least this × √elements (a fragment of zeros or tiny values)."""
MIN_HISTORY = 8
SEED_ROUNDS = 8
"""Most round records a syncer that takes over reads to seed its history."""
HISTORY = 64
"""Accepted contributions remembered per fragment."""


@dataclass
class ContributionHistory:
    """Recent accepted contributions of one fragment: steps, samples and norms."""

    steps: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))
    samples: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))
    norms: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    parameter_bound: float | None = None
    """``PARAMETER_NORM_RATIO`` × the committed parameters' norm (floored); None until known."""

    def anchor(self, parameter_norm: float, elements: int) -> None:
        """The norm and size of the version the next round merges onto (each load and commit)."""
        floor = PARAMETER_NORM_FLOOR * math.sqrt(max(1, elements))
        self.parameter_bound = PARAMETER_NORM_RATIO * max(parameter_norm, floor) if math.isfinite(parameter_norm) else None

    def record(self, steps: int, samples: int, norm: float | None) -> None:
        if steps <= 0:
            return
        self.steps.append(steps)
        self.samples.append(samples)
        if norm is not None:
            self.norms.append(norm)

    def __len__(self) -> int:
        return len(self.steps)

    def seed(self, participants: Iterable[Participant]) -> None:
        """Learn from a committed round (a syncer that just loaded the fragment)."""
        for participant in participants:
            self.record(participant.steps, participant.samples, participant.norm)

    def norm_limit(self, steps: int) -> float | None:
        """The largest norm accepted for a delta of ``steps`` steps: the history's bound (once
        there is enough of it) within the parameters' bound; None when neither is known."""
        bound = self.parameter_bound
        if len(self.norms) < MIN_HISTORY or len(self.steps) < MIN_HISTORY:
            return bound
        typical_steps = statistics.median(self.steps)
        learned = NORM_RATIO * statistics.median(self.norms) * max(1.0, steps / typical_steps)
        return learned if bound is None else min(learned, bound)

    def samples_per_step_cap(self, current: Iterable[tuple[int, int]]) -> float | None:
        """The cap on samples per step for a round whose accepted (steps, samples) are ``current``;
        None before enough history."""
        rates = [s / n for n, s in zip(self.steps, self.samples, strict=True)]
        rates += [s / n for n, s in current if n > 0]
        if len(rates) < MIN_HISTORY:
            return None
        median = statistics.median(rates)
        return SAMPLES_PER_STEP_RATIO * median if median > 0 else None
