"""The training thread's rules beside ``Session`` on numbers and a clock the test gives: which
fragments are due (``session.due``), what the lease and the exchange's pace are told
(``session.progress``), and the bounded waits (``session.waits``). No thread, no request but
the syncer lease the watch reads from a memory mailbox."""

from __future__ import annotations

import threading

import numpy as np

import gradientmail as gm
from gradientmail.algorithms.align import WorkMark
from gradientmail.mailbox import MemoryMailbox
from gradientmail.records import Lease
from gradientmail.session import due
from gradientmail.session.fragment import LearnerFragment
from gradientmail.session.progress import StepTimer, learner_schedule, lease_info
from gradientmail.session.waits import CommitWaits, SyncerWatch
from gradientmail.store import RunStore
from tests.fake_clock import FakeClock

EVERY = 10


def fragments(count: int = 2) -> list[LearnerFragment]:
    anchor = {"w": np.zeros(2, dtype=np.float32)}
    return [LearnerFragment.joined(i, ("w",), anchor, 0) for i in range(count)]


def test_a_due_fragment_publishes_and_moves_to_the_same_step_of_the_next_period() -> None:
    states = fragments()
    states[0].due_step, states[1].due_step = 5, 10
    algorithm = gm.DiLoCo(sync_every=EVERY, quorum_size=2)
    assert due.due_now(states, 5, algorithm, {}) == [0]
    assert (states[0].due_step, due.next_due(states)) == (15, 10)
    assert due.due_now(states, 6, algorithm, {}) == [], "nothing is due between the steps of the staircase"


def test_with_a_quorum_of_one_too_little_training_waits_for_half_a_period() -> None:
    states = fragments(1)
    states[0].due_step, states[0].unmerged_from = 10, WorkMark(8, 8)
    algorithm = gm.DiLoCo(sync_every=EVERY, quorum_size=1)
    assert due.due_now(states, 10, algorithm, {}) == [] and states[0].half_period_pending
    assert due.keeps_attention(states, algorithm, {}), "a count of steps decides: check every step"
    assert due.due_now(states, 13, algorithm, {}) == [0], "half a period trained"


def test_a_fragment_joins_a_round_open_on_its_anchor_only() -> None:
    states = fragments()
    algorithm = gm.DiLoCo(sync_every=EVERY, quorum_size=2)
    for state in states:
        state.due_step = 100
    assert due.joining(states, 3, algorithm, {0: 0, 1: 7}) == {0}, "fragment 1's round is on another version"


def test_the_step_time_is_a_moving_average_of_the_gaps() -> None:
    timer = StepTimer(0.5)
    for now in (0.0, 1.0, 4.0):
        timer.stepped(now)
    assert timer.step_time_s == 0.5 * 1.0 + 0.5 * 3.0


def test_the_lease_says_when_the_next_contribution_is_due_and_not_once_it_is() -> None:
    info = lease_info(steps=4, step_time_s=0.5, versions=[3, 2], elects=True, serving=False, next_due=10)
    assert info["due_in_s"] == 3.0 and info["versions"] == "3,2" and info["closes"] is True
    assert "due_in_s" not in lease_info(steps=10, step_time_s=0.5, versions=[], elects=False, serving=False, next_due=10)
    serving = lease_info(steps=4, step_time_s=0.5, versions=[], elects=True, serving=True, next_due=10)
    assert serving["training"] is False and "due_in_s" not in serving


def test_the_exchange_reads_each_fragments_next_publish_at_the_step_time() -> None:
    states = fragments()
    states[0].due_step, states[1].due_step = 12, 20
    schedule = learner_schedule(states, 10, 0.25, EVERY)
    assert schedule.period_s == 2.5 and schedule.due_in_s == (0.5, 2.5) and schedule.due_steps == (12, 20)
    assert learner_schedule(states, 10, None, EVERY).period_s is None, "no step time yet: nothing to pace by"


def test_a_closing_learner_stops_waiting_a_ttl_after_the_syncer_lease_expired() -> None:
    clock = FakeClock()
    store = RunStore(MemoryMailbox())
    store.leases.create_syncer(Lease(kind="syncer", holder="s", ttl_s=1.0))
    watch = SyncerWatch(store, 1.0, 0.1, clock)
    assert not watch.gone()
    clock.now = 1.05  # the lease stood still a TTL: expired, and the new syncer gets one more
    assert not watch.gone()
    clock.now = 2.1
    assert watch.gone()


def test_polling_until_done_gives_up_after_its_timeout_on_the_clock_it_is_given() -> None:
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    stats = type("Stats", (), {"blocked_s": 0.0})()
    waits = CommitWaits(
        "me", commit_timeout_s=5.0, poll_interval_s=0.1, changed=threading.Condition(), align_ready=lambda: None,
        stats=stats, clock=clock, sleep=sleep,
    )  # fmt: skip
    assert not waits.until(lambda: False, 1.0) and 1.0 <= clock.now < 1.02
    assert waits.until(lambda: clock.now > 1.5, 1.0)
