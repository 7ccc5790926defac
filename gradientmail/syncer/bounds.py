"""Bounds that keep one contribution from steering a round, learned from the run's own history.

A writer without the run key (or a learner gone wrong) can report any counts and any delta.
The syncer bounds both by robust statistics over the rounds it saw committed, each round
summarised by the lower median of its participants (a minority inside a round cannot move it),
and the rounds by their median (a minority of rounds, a forged record among them, cannot move
that):

* samples per step: at most ``SAMPLES_PER_STEP_RATIO`` × the typical samples/steps (the round
  being closed counts as one more round); beyond it samples are capped for the weight (the cap
  is in the round record; replay applies it). Weight is samples²/steps, so the ratio's square
  is the most weight per step one contribution can carry: 4×, 80 % of a round of two;
* delta norm: at most ``NORM_RATIO`` × the typical norm (× steps / typical steps when larger);
  beyond it the contribution is rejected as ``outlier``. The ratio is wide on purpose: honest
  learners pulling different ways on different data were measured 6× apart within one round
  of the chaos benchmark's toy model; what it must stop is the 10³–10³⁸× delta of an attack.

Both need ``MIN_HISTORY`` participants over at least ``MIN_ROUNDS`` rounds before they apply.
From the first round, and always as an outer bound that no history can raise, a delta's norm
may be at most ``PARAMETER_NORM_RATIO`` × the norm of the fragment's committed parameters (at
least ``PARAMETER_NORM_FLOOR`` × √elements, for a fragment initialised at zero): a contribution
that moves the fragment a hundred times its own length is not training, and that stops the
10⁴–10³⁸ deltas before any history exists, or once forged history has inflated the median.
A syncer that takes over seeds the history from the newest ``SEED_ROUNDS`` round records it can
read (each verified against the run key in a signed run); a record with more participants than
a round may hold (``ROUND_CONTRIBUTION_LIMIT``) was not written by a syncer and teaches nothing.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gradientmail.records import Participant

__all__ = [
    "MIN_HISTORY",
    "MIN_ROUNDS",
    "NORM_RATIO",
    "PARAMETER_NORM_FLOOR",
    "PARAMETER_NORM_RATIO",
    "ROUND_CONTRIBUTION_LIMIT",
    "SAMPLES_PER_STEP_RATIO",
    "SEED_ROUNDS",
    "ContributionHistory",
    "RoundFacts",
]

SAMPLES_PER_STEP_RATIO = 2.0
"""A learner's samples per step count up to this many times the run's typical (bigger batches
are legitimate and still merged, their weight capped; a weight of 10³⁰⁰ is not)."""
NORM_RATIO = 25.0
"""A delta may be up to this many times the typical norm (times steps / typical steps)."""
PARAMETER_NORM_RATIO = 100.0
"""A delta may be at most this many times the norm of the fragment's committed parameters."""
PARAMETER_NORM_FLOOR = 0.1
"""The parameters' norm counts as at least this × √elements (a fragment of zeros or tiny values)."""
MIN_HISTORY = 8
"""Participants the learned bounds need before they apply..."""
MIN_ROUNDS = 3
"""...over at least this many rounds (so that the median over rounds has a majority)."""
SEED_ROUNDS = 8
"""Most round records a syncer that takes over reads to seed its history."""
HISTORY_ROUNDS = 16
"""Committed rounds remembered per fragment."""
ROUND_CONTRIBUTION_LIMIT = 1024
"""New contributions one round examines (fetches and validates); the rest are rejected
``flood`` unread, so a bucket writer who drops thousands of records costs a round a listing,
not thousands of reads, and cannot make its record too large to read. Learners with a live
lease are examined first."""


@dataclass(frozen=True)
class RoundFacts:
    """One committed round, summarised by the lower median of its participants."""

    steps: float
    rate: float
    """Samples per step."""
    norm: float | None
    participants: int

    @classmethod
    def of(cls, contributions: Sequence[tuple[int, int, float | None]]) -> RoundFacts | None:
        """From (steps, samples, norm) of a round's participants; None without any that trained."""
        trained = [(n, s, norm) for n, s, norm in contributions if n > 0]
        if not trained:
            return None
        norms = [norm for _, _, norm in trained if norm is not None and math.isfinite(norm)]
        return cls(
            steps=statistics.median_low([n for n, _, _ in trained]),
            rate=statistics.median_low([s / n for n, s, _ in trained]),
            norm=statistics.median_low(norms) if norms else None,
            participants=len(trained),
        )


@dataclass
class ContributionHistory:
    """Recent committed rounds of one fragment, and the bounds they imply."""

    rounds: deque[RoundFacts] = field(default_factory=lambda: deque(maxlen=HISTORY_ROUNDS))
    parameter_bound: float | None = None
    """``PARAMETER_NORM_RATIO`` × the committed parameters' norm (floored); None until known."""

    def anchor(self, parameter_norm: float, elements: int) -> None:
        """The norm and size of the version the next round merges onto (each load and commit)."""
        floor = PARAMETER_NORM_FLOOR * math.sqrt(max(1, elements))
        self.parameter_bound = PARAMETER_NORM_RATIO * max(parameter_norm, floor) if math.isfinite(parameter_norm) else None

    def record(self, contributions: Sequence[tuple[int, int, float | None]]) -> None:
        """Learn from a round this syncer committed: (steps, samples, norm) of its participants."""
        facts = RoundFacts.of(contributions)
        if facts is not None:
            self.rounds.append(facts)

    def seed(self, participants: Sequence[Participant], *, older: bool = False) -> bool:
        """Learn from a committed round read back (a syncer that loaded the fragment): the newest,
        or with ``older`` one before those known (a takeover reads back newest first). False when
        the record cannot be a syncer's (more participants than a round holds): ignored."""
        if len(participants) > ROUND_CONTRIBUTION_LIMIT:
            return False
        facts = RoundFacts.of([(p.steps, p.samples, p.norm) for p in participants])
        if facts is not None and older:
            if len(self.rounds) < HISTORY_ROUNDS:
                self.rounds.appendleft(facts)
        elif facts is not None:
            self.rounds.append(facts)
        return True

    def participants(self) -> int:
        return sum(r.participants for r in self.rounds)

    def learned(self) -> bool:
        """Enough history for the learned bounds."""
        return len(self.rounds) >= MIN_ROUNDS and self.participants() >= MIN_HISTORY

    def norm_limit(self, steps: int) -> float | None:
        """The largest norm accepted for a delta of ``steps`` steps: the history's bound (once
        there is enough of it) within the parameters' bound; None when neither is known."""
        bound = self.parameter_bound
        norms = [r.norm for r in self.rounds if r.norm is not None]
        if not self.learned() or len(norms) < MIN_ROUNDS:
            return bound
        typical_steps = statistics.median(r.steps for r in self.rounds)
        learned = NORM_RATIO * statistics.median(norms) * max(1.0, steps / typical_steps)
        return learned if bound is None else min(learned, bound)

    def samples_per_step_cap(self, current: Iterable[tuple[int, int]]) -> float | None:
        """The cap on samples per step for a round whose accepted (steps, samples) are ``current``;
        None before enough history."""
        if not self.learned():
            return None
        rates = [r.rate for r in self.rounds]
        now = RoundFacts.of([(n, s, None) for n, s in current])
        if now is not None:
            rates.append(now.rate)
        typical = statistics.median(rates)
        return SAMPLES_PER_STEP_RATIO * typical if typical > 0 else None
