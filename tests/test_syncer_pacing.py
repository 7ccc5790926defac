"""The syncer's schedule of reads as pure rules (``syncer/pacing.py``), without a mailbox."""

from __future__ import annotations

import pytest

from gradientmail.records import Lease
from gradientmail.syncer.pacing import LEASE_READ_IDLE_INTERVALS, SyncerPacing

POLL_S = 0.2
IDLE_S = 10.0 / 3


def lease(due_in_s: object, holder: str = "a", **info: object) -> Lease:
    return Lease(kind="learner", holder=holder, sequence=1, ttl_s=10.0, info={"due_in_s": due_in_s, **info})


def test_quiet_full_passes_back_off_to_the_cap_and_activity_resets_them() -> None:
    pacing = SyncerPacing(POLL_S, IDLE_S)
    now, seen = 0.0, []
    for _ in range(6):
        assert pacing.start_pass(now)
        pace = pacing.end_pass(now, full=True, active=False, busy=False, leases_in_s=float("inf"))
        seen.append(pace.interval_s)
        now += pace.interval_s
    assert seen == [0.4, 0.8, 1.6, 3.2, IDLE_S, IDLE_S]  # to the idle interval
    assert pacing.end_pass(now, full=False, active=True, busy=False, leases_in_s=float("inf")).interval_s == POLL_S


def test_a_watcher_reads_the_election_once_per_idle_interval_or_at_once_when_expired() -> None:
    pacing = SyncerPacing(POLL_S, IDLE_S)
    pacing.election_read_at = 0.0
    assert pacing.election_due(1.0, holder=True, lease_age_s=1.0, ttl_s=10.0)
    assert not pacing.election_due(1.0, holder=False, lease_age_s=1.0, ttl_s=10.0)
    assert pacing.election_due(IDLE_S, holder=False, lease_age_s=1.0, ttl_s=10.0)
    assert pacing.election_due(1.0, holder=False, lease_age_s=10.0, ttl_s=10.0)


def test_a_lease_saying_a_contribution_is_due_opens_a_window_the_next_pass_is_timed_for() -> None:
    pacing = SyncerPacing(POLL_S, IDLE_S)
    pacing.expect(0.0, [lease(10.0), lease(True), lease(-1), lease("soon")])  # only the first is a hint
    assert pacing.expecting(0.0) == (False, pytest.approx(10.0 - IDLE_S))
    assert pacing.expecting(10.0) == (True, float("inf"))
    pacing.collect_every_s = IDLE_S  # backed off after a quiet spell
    before = 10.0 - IDLE_S - 1.0  # the window opens in a second, before the next full pass
    assert pacing.start_pass(before)
    pace = pacing.end_pass(before, full=True, active=False, busy=False, leases_in_s=float("inf"))
    assert pace.interval_s == IDLE_S and pace.pause_at_most_s == pytest.approx(POLL_S)
    assert pacing.collect_every_s == POLL_S  # at the regular pace when it opens


def test_leases_are_read_at_poll_pace_while_a_round_waits_and_when_one_expires() -> None:
    """Idle, the leases are read less often than learners renew them (every TTL/3 = IDLE_S), so
    every read finds each live lease changed; a lease that stops is read when it would expire."""
    pacing = SyncerPacing(POLL_S, IDLE_S)
    pacing.leases_read_at = 0.0
    assert pacing.leases_in(0.0, waiting=False, expiries_s=[]) == LEASE_READ_IDLE_INTERVALS * IDLE_S > IDLE_S
    assert pacing.leases_in(0.0, waiting=True, expiries_s=[]) == POLL_S
    assert pacing.leases_in(0.0, waiting=False, expiries_s=[1.0]) == 1.0
    assert pacing.leases_due(0.0) and not pacing.leases_due(1.0)


def test_a_training_lease_without_a_due_time_opens_a_window_now_and_our_own_lease_none() -> None:
    """A learner that trains (its step time known) and says nothing of its next contribution has
    one due now; a learner not training yet (no step time), one that pauses, and this node's own
    learner (its uploads wake the syncer in-process) open no window."""
    pacing = SyncerPacing(POLL_S, IDLE_S, me="me")
    pacing.expect(
        0.0, [lease(None, step_time_s=0.0), lease(None, training=False, step_time_s=0.1), lease(None, "me", step_time_s=0.1)]
    )
    assert pacing.expecting(0.0) == (False, float("inf"))
    pacing.expect(0.0, [lease(None, step_time_s=0.1)])
    assert pacing.expecting(0.0)[0] and pacing.expecting(IDLE_S)[0] and not pacing.expecting(IDLE_S + 0.1)[0]


def test_the_head_is_probed_once_per_its_own_interval_unless_forced() -> None:
    pacing = SyncerPacing(POLL_S, IDLE_S, head_probe_s=30.0)
    assert pacing.probe_head(0, 0.0, forced=False)
    assert not pacing.probe_head(0, 29.0, forced=False) and pacing.probe_head(0, 29.0, forced=True)
    assert pacing.probe_head(0, 59.5, forced=False)


def test_the_listing_backs_off_to_half_the_shortest_period_and_the_watch_follows_an_awaited_commit() -> None:
    """A contribution no lease announced (a learner's last, flushed at close) is seen within half
    the shortest sync period the leases show; a watcher whose learner awaits a commit reads the
    syncer lease at that learner's look pace, so a holder that resigned is replaced that soon."""
    pacing = SyncerPacing(POLL_S, IDLE_S, sync_every=20)
    pacing.expect(0.0, [lease(None, step_time_s=0.05), lease(None, "b", step_time_s=1.0)])  # periods 1 s and 20 s
    assert pacing.collect_max_s == pytest.approx(0.5) and pacing.steady_s == POLL_S
    pacing.expect(0.0, [lease(None, "b", step_time_s=1.0)])
    assert pacing.collect_max_s == IDLE_S and pacing.steady_s == pytest.approx(2.0)
    pacing.election_read_at = 0.0
    assert not pacing.election_due(0.5, holder=False, lease_age_s=0.5, ttl_s=10.0)
    assert pacing.election_due(0.5, holder=False, lease_age_s=0.5, ttl_s=10.0, watch_every_s=0.5)


def test_while_no_other_learner_has_stepped_the_listing_backs_off_further() -> None:
    """A learner that has not stepped (step time 0) publishes nothing before its first due step
    and its next renewal shows its step time: the quiet listing waits three idle intervals; a lease
    that says nothing of its step time (an older node's) keeps the idle interval."""
    pacing = SyncerPacing(POLL_S, IDLE_S, sync_every=20)
    pacing.expect(0.0, [lease(None, step_time_s=0.0), lease(None, "b", step_time_s=0.0)])
    assert pacing.collect_max_s == pytest.approx(3 * IDLE_S)
    pacing.expect(0.0, [lease(None, step_time_s=0.0), lease(None, "b")])
    assert pacing.collect_max_s == IDLE_S
