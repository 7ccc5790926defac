"""INV-12's learned bounds (``syncer.bounds``): robust statistics that a minority of fake ids, a
forged round record or one inflated learner cannot drag."""

from __future__ import annotations

from gradientmail.records import Participant
from gradientmail.syncer.bounds import (
    MIN_ROUNDS,
    NORM_RATIO,
    ROUND_CONTRIBUTION_LIMIT,
    SAMPLES_PER_STEP_RATIO,
    UNSIGNED_SAMPLES_PER_STEP_RATIO,
    ContributionHistory,
    round_outliers,
)

STEPS, SAMPLES, NORM = 10, 80, 1.0


def participants(norms: list[float], *, samples: int = SAMPLES) -> list[Participant]:
    return [
        Participant(learner=f"l{i}", contribution=f"c{i}", steps=STEPS, samples=samples, weight=1.0, norm=norm)
        for i, norm in enumerate(norms)
    ]


def test_a_minority_of_fake_ids_at_the_limit_every_round_cannot_raise_it():
    """INV-12: three honest learners and two fakes that report exactly the current limit, round after
    round: per-contribution medians would climb NORM_RATIO-fold a round; the limit stays put."""
    history = ContributionHistory()
    for _ in range(MIN_ROUNDS):
        history.record([(STEPS, SAMPLES, NORM)] * 3)
    first = history.norm_limit(STEPS)
    assert first == NORM_RATIO * NORM
    for _ in range(7):
        limit = history.norm_limit(STEPS)
        assert limit is not None
        history.record([(STEPS, SAMPLES, NORM)] * 3 + [(STEPS, SAMPLES, limit)] * 2)
    assert history.norm_limit(STEPS) == first


def test_a_record_listing_more_participants_than_a_round_holds_teaches_nothing():
    """INV-12: a forged 36,000-participant round record (unsigned run) read by a syncer that takes over."""
    history = ContributionHistory()
    assert not history.seed(participants([1e30] * 36_000))
    assert len(participants([1.0] * ROUND_CONTRIBUTION_LIMIT)) == ROUND_CONTRIBUTION_LIMIT
    assert history.norm_limit(STEPS) is None and history.samples_per_step_cap([], signed=True) is None


def test_one_forged_record_among_those_seeded_does_not_move_the_bounds():
    """INV-12: a takeover reads back the newest rounds, newest first; one of them forged with norms of
    1e30 and 10**6 samples per step leaves both bounds at the honest rounds'."""
    history = ContributionHistory()
    history.seed(participants([NORM, NORM]))
    history.seed(participants([1e30] * 50, samples=10**6 * STEPS), older=True)
    history.seed(participants([NORM, NORM]), older=True)
    history.seed(participants([NORM, NORM]), older=True)
    assert history.norm_limit(STEPS) == NORM_RATIO * NORM
    assert history.samples_per_step_cap([(STEPS, SAMPLES)], signed=True) == SAMPLES_PER_STEP_RATIO * SAMPLES / STEPS


def test_an_inflated_learner_in_a_round_of_two_carries_at_most_the_capped_share():
    """INV-12: weight is samples^2/steps: capped at SAMPLES_PER_STEP_RATIO x the typical samples per step,
    a learner reporting 1000x carries ratio^2 / (ratio^2 + 1) of a two-learner round (80 %)."""
    history = ContributionHistory()
    for _ in range(4):
        history.record([(STEPS, SAMPLES, NORM), (STEPS, SAMPLES * 1000, NORM)])
    cap = history.samples_per_step_cap([(STEPS, SAMPLES), (STEPS, SAMPLES * 1000)], signed=True)
    assert cap == SAMPLES_PER_STEP_RATIO * SAMPLES / STEPS
    honest = SAMPLES**2 / STEPS
    inflated = min(SAMPLES * 1000, cap * STEPS) ** 2 / STEPS
    share = inflated / (inflated + honest)
    assert share == SAMPLES_PER_STEP_RATIO**2 / (SAMPLES_PER_STEP_RATIO**2 + 1)


def test_the_parameter_bound_holds_before_history_and_caps_what_history_learns():
    """INV-12: 100x the committed parameters' norm, from the first round and above any history."""
    history = ContributionHistory()
    assert history.norm_limit(STEPS) is None
    history.anchor(parameter_norm=2.0, elements=4)
    assert history.norm_limit(STEPS) == 200.0
    for _ in range(MIN_ROUNDS):
        history.record([(STEPS, SAMPLES, 1e6)] * 3)  # a history of huge deltas cannot raise it
    assert history.norm_limit(STEPS) == 200.0


def test_in_a_young_run_the_first_committed_round_bounds_the_next():
    """INV-12, issue 43 case 6: one honest round known (no learned history yet), an insider's x1000
    delta is past the bound of NORM_RATIO x the round's norm; a delta of more steps is allowed more."""
    history = ContributionHistory()
    history.anchor(parameter_norm=100.0, elements=4)  # the parameters' bound alone: 10,000
    history.record([(STEPS, SAMPLES, NORM), (STEPS, SAMPLES, 2 * NORM)])
    assert history.norm_limit(STEPS) == NORM_RATIO * NORM  # the round's lower median
    assert history.norm_limit(4 * STEPS) == 4 * NORM_RATIO * NORM
    history.record([(STEPS, SAMPLES, 3 * NORM)])  # a young run takes its largest round: no early small one denies
    assert history.norm_limit(STEPS) == NORM_RATIO * 3 * NORM


def test_a_young_round_of_zero_deltas_teaches_no_scale():
    """A frozen fragment's rounds (every delta zero) leave only the parameters' bound."""
    history = ContributionHistory()
    history.anchor(parameter_norm=2.0, elements=4)
    history.record([(STEPS, SAMPLES, 0.0)] * 2)
    assert history.norm_limit(STEPS) == 200.0
    assert round_outliers([(STEPS, 0.0), (STEPS, 0.0), (STEPS, 5.0)]) == []


def test_a_round_majority_rejects_one_insiders_delta_before_any_history():
    """INV-12, issue 43 case 6: two honest deltas and one x1000 in the first round: the round's own
    lower median bounds it. Two contributions decide nothing (either may lie); a tiny delta
    among three cannot push an honest one out; more steps are allowed more."""
    assert round_outliers([(STEPS, NORM), (STEPS, 1.5 * NORM), (STEPS, 1000 * NORM)]) == [2]
    assert round_outliers([(STEPS, NORM), (STEPS, 1000 * NORM)]) == []
    assert round_outliers([(STEPS, NORM), (STEPS, 1.5 * NORM), (STEPS, 1e-9)]) == []
    assert round_outliers([(STEPS, NORM), (STEPS, NORM), (10 * STEPS, 40 * NORM)]) == []
    assert round_outliers([(STEPS, NORM), (STEPS, NORM), (STEPS, 6 * NORM)]) == []  # honest spread


def test_an_unsigned_run_counts_a_fake_ids_samples_at_its_fair_share_from_the_first_round():
    """INV-12, issue 43 case 7: without a run key and before any history, a fake id claiming 1000x the
    samples per step among two honest learners weighs what one of them does (a third of the round);
    a signed run keeps 2x the typical (4x the weight per step)."""
    history = ContributionHistory()
    current = [(STEPS, SAMPLES), (STEPS, SAMPLES), (STEPS, SAMPLES * 1000)]
    unsigned = history.samples_per_step_cap(current, signed=False)
    assert unsigned == UNSIGNED_SAMPLES_PER_STEP_RATIO * SAMPLES / STEPS
    weights = [min(s, unsigned * n) ** 2 / n for n, s in current]
    assert weights[2] / sum(weights) == 1 / 3
    assert history.samples_per_step_cap(current, signed=True) == SAMPLES_PER_STEP_RATIO * SAMPLES / STEPS
