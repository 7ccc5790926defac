"""How long a round waits after quorum (``DiLoCo.grace_rule``), as a rule and on a fake clock.

The case that fails with the slack rule: steps of 13 ms, H = 20, quorum 1, a second learner
whose contribution arrives 0.2 s after the first (a mailbox round trip). The slack window is
~0, so the first learner closes every round alone and the second's work comes stale; a rule
that measures arrivals waits for it from the round after it was first seen late.
"""

from __future__ import annotations

import pytest

from gradientmail.syncer import GraceEstimator
from tests.short_step_rounds import POLL_S, STEP_S, H, two_short_step_rounds


def test_the_slack_rule_gives_short_steps_no_window():
    grace = GraceEstimator(gamma=0.5, tau=4.0, max_s=60.0, sync_every=H, margin_s=POLL_S)
    grace.observe_step_times([STEP_S])
    grace.observe_lateness(0.4)  # the slack rule does not look at arrivals
    assert grace.window(0.0) == pytest.approx(0.5 * 4 * STEP_S)


def test_the_arrivals_rule_waits_as_late_as_recent_contributions_came_up_to_its_cap():
    """INV-17: at least the 90th percentile of recent lateness plus a poll, at most
    ``grace_periods`` round periods and ``grace_max_s``."""
    grace = GraceEstimator(gamma=0.5, tau=4.0, max_s=60.0, rule="arrivals", periods=2.0, sync_every=H, margin_s=POLL_S)
    grace.observe_step_times([STEP_S])
    slack = 0.5 * 4 * STEP_S
    assert grace.window(0.0) == pytest.approx(slack)  # nothing measured yet
    for lateness in (0.0, 0.0, 0.0, 0.1):
        grace.observe_lateness(lateness)
    assert grace.window(0.0) == pytest.approx(0.1 + POLL_S)
    grace.observe_lateness(5.0)  # a straggler: the wait stops at two round periods
    assert grace.window(0.0) == pytest.approx(2.0 * H * STEP_S)
    capped = GraceEstimator(max_s=0.05, rule="arrivals", periods=2.0, sync_every=H, step_time_s=STEP_S, margin_s=POLL_S)
    capped.observe_lateness(0.3)
    assert capped.window(0.0) == 0.05
    on_time = GraceEstimator(0.5, 4.0, rule="arrivals", sync_every=H, step_time_s=STEP_S, margin_s=POLL_S)
    for _ in range(8):
        on_time.observe_lateness(-0.5)  # arrived before quorum: counted as 0, no wait added
    assert on_time.window(0.0) == pytest.approx(0.5 * 4 * STEP_S)


def test_the_live_rule_waits_up_to_its_round_periods():
    """INV-17: the ``live`` rule's window is ``grace_periods`` round periods (the runtime ends it
    once every live learner is in)."""
    grace = GraceEstimator(rule="live", periods=1.5, sync_every=H, step_time_s=STEP_S)
    assert grace.window(0.0) == pytest.approx(1.5 * H * STEP_S)
    assert GraceEstimator(rule="live", periods=1.5, sync_every=H).window(0.0) == 0.0  # no step time yet


def _participants_of_two_rounds(rule: str) -> list[set[str]]:
    store = two_short_step_rounds(rule)
    return [{p.learner for p in store.read_round(0, version).participants} for version in (1, 2)]


def test_with_short_steps_the_slack_rule_closes_each_round_on_the_first_learner():
    """The case that fails today: the second learner's work never makes a round."""
    assert _participants_of_two_rounds("slack") == [{"a"}, {"a"}]


def test_with_short_steps_the_arrivals_rule_waits_for_a_learner_seen_late_once():
    """INV-17: the first round closes on ``a`` alone and ``b``'s contribution comes stale, 0.2 s
    late; from then on the window covers it and the next round merges both."""
    assert _participants_of_two_rounds("arrivals") == [{"a"}, {"a", "b"}]


def test_with_short_steps_the_live_rule_waits_for_every_live_learner():
    """INV-17: within its round periods the ``live`` rule waits until every live learner is in."""
    assert _participants_of_two_rounds("live") == [{"a", "b"}, {"a", "b"}]
