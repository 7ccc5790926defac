"""Bounds that keep one contribution from steering a round, learned from the run's own history.

A writer without the run key (or a learner gone wrong) can report any counts and any delta.
The syncer bounds both by robust statistics over the rounds it saw committed, each round
summarised by the lower median of its participants (a minority inside a round cannot move it),
and the rounds by their median (a minority of rounds, a forged record among them, cannot move
that):

* samples per step: at most ``SAMPLES_PER_STEP_RATIO`` × the typical samples/steps in a signed
  run, ``UNSIGNED_SAMPLES_PER_STEP_RATIO`` × (1: the typical itself) in an unsigned one, where
  any writer may file under made-up ids and a fake id may carry no more than an honest learner
  of the typical batch: its fair share. The round being closed counts as one more round, and
  before there is history it is the only one. Beyond the cap samples are capped for the weight
  (the cap is in the round record; replay applies it). Weight is samples²/steps, so the ratio's
  square is the most weight per step one contribution can carry: 4× in a signed run;
* delta norm: at most ``NORM_RATIO`` × the typical norm (× steps / typical steps when larger);
  beyond it the contribution is rejected as ``outlier``. The ratio is wide on purpose: honest
  learners pulling different ways on different data were measured 6× apart within one round
  of the chaos benchmark's toy model; what it must stop is the 10³–10³⁸× delta of an attack.
  Three sources of "typical", each a bound of its own: the median over rounds once
  ``MIN_HISTORY`` participants over ``MIN_ROUNDS`` rounds are known; before that, from the
  first committed round on, the largest of the few rounds' lower medians (a young run: no
  forged or early round can lower it below what an honest majority of any round moved); and at
  close, the round's own lower median once it holds ``ROUND_MAJORITY`` contributions
  (``round_outliers``: an honest majority of the round outvotes one insider from the first
  round on, before any history exists).

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
    "ROUND_MAJORITY",
    "SAMPLES_PER_STEP_RATIO",
    "SEED_ROUNDS",
    "UNSIGNED_SAMPLES_PER_STEP_RATIO",
    "ContributionHistory",
    "RoundFacts",
    "round_outliers",
]

SAMPLES_PER_STEP_RATIO = 2.0
"""A learner's samples per step count up to this many times the run's typical (bigger batches
are legitimate and still merged, their weight capped; a weight of 10³⁰⁰ is not)."""
UNSIGNED_SAMPLES_PER_STEP_RATIO = 1.0
"""The same in an unsigned run: a learner's weight per step at most the typical learner's (a
larger batch than the typical is merged with the typical's weight per step; a run key keeps it)."""
NORM_RATIO = 25.0
"""A delta may be up to this many times the typical norm (times steps / typical steps)."""
ROUND_MAJORITY = 3
"""Contributions a round needs at close before its own lower median bounds their norms (with
three, the median is one of any two that agree; with two, nothing tells which one lies)."""
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
        """The largest norm accepted for a delta of ``steps`` steps: the history's bound within
        the parameters' bound; None when neither is known. Once learned, the history's typical
        norm is the median over its rounds; before (a young run), the largest round's."""
        bound = self.parameter_bound
        rounds = [r for r in self.rounds if r.norm is not None]
        if not rounds:
            return bound
        norms = [r.norm for r in rounds if r.norm is not None]
        learned = self.learned() and len(norms) >= MIN_ROUNDS
        typical = statistics.median(norms) if learned else max(norms)
        if typical <= 0:
            return bound  # deltas of zero (a frozen fragment) teach no scale
        limit = _norm_limit(typical, statistics.median(r.steps for r in rounds), steps)
        return limit if bound is None else min(limit, bound)

    def samples_per_step_cap(self, current: Iterable[tuple[int, int]], *, signed: bool) -> float | None:
        """The cap on samples per step for a round whose accepted (steps, samples) are ``current``:
        the ratio (``signed`` or not) × the typical, the median over the history's rounds and
        this one once learned, this round's lower median before; None without either."""
        now = RoundFacts.of([(n, s, None) for n, s in current])
        rates = [r.rate for r in self.rounds] if self.learned() else []
        if now is not None:
            rates.append(now.rate)
        if not rates:
            return None
        typical = statistics.median(rates)
        ratio = SAMPLES_PER_STEP_RATIO if signed else UNSIGNED_SAMPLES_PER_STEP_RATIO
        return ratio * typical if typical > 0 else None


def round_outliers(contributions: Sequence[tuple[int, float]]) -> list[int]:
    """Which of a closing round's (steps, norm) exceed ``NORM_RATIO`` × the round's own lower
    median norm (× steps / its lower median steps when larger): their indices, none below
    ``ROUND_MAJORITY`` contributions. What history cannot yet bound, an honest majority of the
    round does: one insider's ×1000 delta in a young run."""
    if len(contributions) < ROUND_MAJORITY:
        return []
    typical = statistics.median_low([norm for _, norm in contributions])
    if typical <= 0:
        return []  # a majority of zero deltas (a frozen fragment) teaches no scale
    typical_steps = statistics.median_low([steps for steps, _ in contributions])
    return [i for i, (steps, norm) in enumerate(contributions) if norm > _norm_limit(typical, typical_steps, steps)]


def _norm_limit(typical_norm: float, typical_steps: float, steps: int) -> float:
    """``NORM_RATIO`` × the typical norm, scaled up for a delta of more steps than the typical."""
    return NORM_RATIO * typical_norm * max(1.0, steps / typical_steps)
