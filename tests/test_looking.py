"""The learner's when-to-look rules (``session.looking.LearnerLooking``) on a clock the test holds.

Each test drives the pure core with explicit times, the way the exchange does on every pass, and
checks the decision it returns: which fragments a look probes, when the next pass may sleep until,
which rounds to join. No request, no thread."""

from __future__ import annotations

import math

from gradientmail.session.looking import (
    BULLETIN_CHECK_TTLS,
    HEAD_CHECK_TTLS,
    FragmentSeen,
    LearnerLooking,
    LearnerSchedule,
    due_lead_s,
    joins_with,
)
from gradientmail.store import UNKNOWN_HEAD
from gradientmail.store.bulletin import OpenRoundNote, RoundsBulletin

TTL_S = 3.0
POLL_S = 0.1
IDLE_S = TTL_S / 3


def looking(fragments: int = 2, quorum: int = 2, joined_at: float = 0.0) -> LearnerLooking:
    return LearnerLooking(
        fragments, poll_interval_s=POLL_S, idle_interval_s=IDLE_S, lease_ttl_s=TTL_S, quorum_size=quorum,
        joined_at=joined_at,
    )  # fmt: skip


def test_a_look_is_due_once_per_interval_always_with_an_own_bulletin_and_after_a_watched_one() -> None:
    rules = looking()
    assert rules.look_due(10.0, 1.0, own_bulletin=False)
    assert not rules.look_due(10.5, 1.0, own_bulletin=False)
    assert rules.look_due(10.9, 1.0, own_bulletin=False), "0.9 of the interval counts (the loop wakes a little early)"
    assert rules.look_due(10.95, 1.0, own_bulletin=True), "holding the election, looking is free"
    rules.note(RoundsBulletin(heads=(0, 0)), 11.0)
    assert rules.look_due(11.01, 1.0, own_bulletin=False), "the election watch read a bulletin since the last look"
    assert not rules.look_due(11.02, 1.0, own_bulletin=False)


def test_without_a_bulletin_a_look_probes_every_fragment_and_the_head_pointer_once_per_head_check() -> None:
    rules = looking(fragments=3, joined_at=5.0)
    first = rules.unfollowed(5.0 + 1.0)
    assert first.probe == {0, 1, 2} and not first.from_head, "joined at the newest: no head check yet"
    due = 5.0 + HEAD_CHECK_TTLS * TTL_S
    assert rules.unfollowed(due).from_head
    assert not rules.unfollowed(due + 1.0).from_head


def test_following_a_bulletin_probes_what_moved_and_checks_one_fragment_in_turn_from_its_head() -> None:
    rules = looking(fragments=3)
    seen = [FragmentSeen(2), FragmentSeen(5), FragmentSeen(1)]
    look = rules.followed(1.0, RoundsBulletin(heads=(3, 5, UNKNOWN_HEAD)), 1.0, seen, own=False)
    assert look.probe == {0, 2} and not look.from_head
    look = rules.followed(1.5, RoundsBulletin(heads=(4, 5, 1)), 1.5, seen, own=False)
    assert look.probe == {0} and look.from_head, "two versions ahead: retention may have taken the one between"
    still = RoundsBulletin(heads=(2, 5, 1))
    checks = [BULLETIN_CHECK_TTLS * TTL_S * k for k in (1, 2, 3, 4)]
    assert [rules.followed(t, still, t, seen, own=False).probe for t in checks] == [{0}, {1}, {2}, {0}]
    assert rules.followed(checks[-1] + 1.0, still, checks[-1] + 1.0, seen, own=False).probe == set()
    assert rules.followed(checks[-1] * 2, still, checks[-1] * 2, seen, own=True).probe == set(), (
        "this node's own bulletin is no hint: it is not checked against the head"
    )


def test_a_learner_joins_rounds_one_short_of_quorum_not_counting_its_own_contribution() -> None:
    assert [joins_with(q) for q in (1, 2, 3, 5)] == [1, 1, 2, 4]
    rules = looking(fragments=2, quorum=3)
    bulletin = RoundsBulletin(heads=(4, 7), open={0: OpenRoundNote(4, 2), 1: OpenRoundNote(7, 2)})
    ours_in_one = [FragmentSeen(4), FragmentSeen(7, awaiting=True, held_base=7)]
    assert rules.rounds_opened(bulletin, ours_in_one) == {0: 4}
    assert rules.rounds_opened(bulletin, [FragmentSeen(3), FragmentSeen(7)]) == {1: 7}, "a round on a version we lack"
    assert rules.has_news(bulletin, ours_in_one), "the rounds to join changed"
    assert rules.set_open_rounds({0: 4}) and rules.open_rounds == {0: 4}
    assert not rules.set_open_rounds({0: 4}), "unchanged: no wake"
    assert not rules.has_news(bulletin, ours_in_one)
    assert rules.rounds_counted({0: 1, 1: 2}, ours_in_one) == {1: 7}
    assert not rules.set_open_rounds({}), "none open: nothing for the training thread to look at"


def test_an_announced_close_hurries_the_exchange_once_per_round_and_bounds_the_next_pause() -> None:
    rules = looking(fragments=1)
    awaiting = [FragmentSeen(3, awaiting=True, held_base=3)]
    bulletin = RoundsBulletin(heads=(3,), open={0: OpenRoundNote(3, 1, closes_in_s=2.0)})
    rules.followed(10.0, bulletin, 9.5, awaiting, own=False)
    idle = LearnerSchedule()
    assert rules.next_pass(10.0, 1.0, idle, awaiting=True, following=True).pause_at_most_s == 0.0, "never looked"
    rules.look_due(10.0, 1.0, own_bulletin=False)
    pace = rules.next_pass(10.0, 1.0, idle, awaiting=True, following=True)
    assert math.isclose(pace.pause_at_most_s, 1.0), "the next look comes first"
    pace = rules.next_pass(10.0, 5.0, idle, awaiting=True, following=True)
    assert math.isclose(pace.pause_at_most_s, 1.5), "the close announced at 9.5 + 2.0"
    assert pace.interval_s == 5.0 and not pace.settle
    assert not rules.round_closing(11.0, {0})
    assert rules.round_closing(11.5, {0})
    rules.followed(12.0, bulletin, 12.0, awaiting, own=False)
    assert not rules.round_closing(20.0, {0}), "hurried for this round already"


def test_an_awaited_commit_is_polled_at_the_poll_interval_unless_a_bulletin_is_followed() -> None:
    rules = looking()
    rules.look_due(0.0, 1.0, own_bulletin=False)
    assert rules.next_pass(0.0, 1.0, LearnerSchedule(), awaiting=True, following=False).interval_s == POLL_S
    assert rules.next_pass(0.0, 1.0, LearnerSchedule(), awaiting=False, following=False).settle
    rules.followed(0.0, RoundsBulletin(heads=(0, 0)), 0.0, [FragmentSeen(0), FragmentSeen(0)], own=False)
    assert rules.following(0.0 + 1.0, 1.0)
    assert not rules.following(0.0 + 1.0 + POLL_S + 0.01, 1.0)


def test_a_fragment_is_probed_once_per_due_step_just_before_its_publish() -> None:
    rules = looking(fragments=2)
    lead = due_lead_s(POLL_S)
    schedule = LearnerSchedule(period_s=4.0, due_in_s=(lead + 0.5, None), due_steps=(40, 0))
    rules.look_due(0.0, 4.0, own_bulletin=False)
    assert rules.due_soon(schedule) == set()
    assert math.isclose(rules.next_pass(0.0, 4.0, schedule, awaiting=False, following=False).pause_at_most_s, 0.5)
    closer = LearnerSchedule(period_s=4.0, due_in_s=(lead, None), due_steps=(40, 0))
    assert rules.due_soon(closer) == {0}
    assert rules.due_soon(closer) == set(), "once per due step"
    assert rules.due_soon(LearnerSchedule(period_s=4.0, due_in_s=(lead, None), due_steps=(80, 0))) == {0}


def test_the_look_interval_follows_the_sync_period_between_the_poll_and_the_idle_interval() -> None:
    rules = looking()
    assert rules.look_every_s(LearnerSchedule()) == IDLE_S, "not training: the idle interval"
    assert rules.look_every_s(LearnerSchedule(period_s=0.01)) == POLL_S
    assert math.isclose(rules.look_every_s(LearnerSchedule(period_s=5.0)), 0.5)
    assert rules.noted_live() is None
    rules.note(RoundsBulletin(heads=(0, 0), live=3), 1.0)
    assert rules.noted_live() == 3
    assert rules.fresh_bulletin(1.0 + 0.5, 0.5) is not None
    assert rules.fresh_bulletin(1.0 + 0.5 + POLL_S + 0.01, 0.5) is None
