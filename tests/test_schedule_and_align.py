"""The learner's rules as pure functions: when a due fragment publishes, and the align/delta arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from gradientmail.algorithms import align, schedule
from gradientmail.algorithms.align import AlignAction, WorkMark, aligned_parameters, plan_alignment, pseudo_gradient
from gradientmail.algorithms.fragments import due_fragments
from gradientmail.backends import Backend, get_backend
from tests.backend_params import BACKENDS, tensor, values


def test_the_first_exchange_is_on_the_staircase_and_later_ones_a_period_after_the_round():
    firsts = [schedule.first_due_step(p, 8, 100) for p in range(8)]
    assert firsts == [12, 25, 37, 50, 62, 75, 87, 100]
    assert firsts == [next(t for t in range(1, 201) if p in due_fragments(t, 8, 100)) for p in range(8)]
    assert schedule.first_due_step(0, 1, 7) == 7
    assert schedule.next_due(aligned_at=53, merged_publish=None, sync_every=50) == 103  # late: re-phased on the commit
    assert schedule.next_due(aligned_at=53, merged_publish=50, sync_every=50) == 100  # in the round: no slip


@pytest.mark.parametrize(("sync_every", "half"), [(1, 1), (2, 1), (10, 5), (11, 6), (100, 50)])
def test_half_period_rounds_up(sync_every, half):
    assert schedule.half_period(sync_every) == half


def test_a_scheduled_exchange_short_of_half_a_period_waits_or_skips_by_quorum():
    assert schedule.on_schedule(steps_since_align=5, sync_every=10, quorum_size=1) is schedule.OnSchedule.PUBLISH
    assert schedule.on_schedule(steps_since_align=12, sync_every=10, quorum_size=3) is schedule.OnSchedule.PUBLISH
    assert schedule.on_schedule(steps_since_align=4, sync_every=10, quorum_size=1) is schedule.OnSchedule.PUBLISH_AT_HALF_PERIOD
    assert schedule.on_schedule(steps_since_align=4, sync_every=10, quorum_size=2) is schedule.OnSchedule.SKIP


def test_in_flight_and_overlap_bounds():
    assert schedule.slot_free(published_fragments=7, in_flight=None)
    assert schedule.slot_free(published_fragments=1, in_flight=2)
    assert not schedule.slot_free(published_fragments=2, in_flight=2)
    assert not schedule.must_wait_for_commit(steps_since_publish=100, overlap_steps=None, room_steps=140)
    assert not schedule.must_wait_for_commit(steps_since_publish=1, overlap_steps=2, room_steps=140)
    assert schedule.must_wait_for_commit(steps_since_publish=2, overlap_steps=2, room_steps=140)
    assert schedule.must_wait_for_commit(steps_since_publish=0, overlap_steps=0, room_steps=140)
    # never trains past what the next contribution can hold: more would be dropped at the alignment
    assert schedule.must_wait_for_commit(steps_since_publish=140, overlap_steps=None, room_steps=140)
    assert schedule.overlap_bound(overlap_steps=200, room_steps=140) == 140


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    return get_backend(request.param)


def test_pseudo_gradient_is_anchor_minus_local_in_the_travel_dtype():
    anchor, local = {"w": np.array([1.0, 2.0, 3.0], np.float32)}, {"w": np.array([0.5, 2.5, 3.0], np.float32)}
    delta = pseudo_gradient(anchor, local, lambda name: "bfloat16")
    assert delta["w"].dtype.name == "bfloat16"
    np.testing.assert_array_equal(delta["w"].astype(np.float32), [0.5, -0.5, 0.0])
    fp32 = pseudo_gradient(anchor, local, lambda name: "float32")
    assert fp32["w"].dtype == np.float32


def test_a_commit_merged_our_contribution_only_if_its_round_lists_us_and_ours_was_on_its_base():
    assert align.contribution_merged(True, published_base=4, commit_base=4)
    assert not align.contribution_merged(False, published_base=4, commit_base=4)  # the round did not take it
    assert not align.contribution_merged(True, published_base=3, commit_base=4)  # ours went to another round
    assert not align.contribution_merged(True, published_base=None, commit_base=4)  # none outstanding


def plan(merged_at, *, anchor_step=10, versions_ahead=1, carry=True, limit=100, room=100):  # type: ignore[no-untyped-def]
    """The plan at step 30 (300 samples) of work unmerged since step 5."""
    return plan_alignment(
        carry=carry, merged_at=merged_at, unmerged_from=WorkMark(5, 50), now=WorkMark(30, 300), anchor_step=anchor_step,
        versions_ahead=versions_ahead, carry_limit_steps=limit, room_steps=room,
    )  # fmt: skip


def test_an_alignment_carries_the_unmerged_work_from_where_it_began():
    """INV-9: the plan says where unmerged work begins and whether it is carried, replaced or dropped."""
    now, published, earlier = WorkMark(30, 300), WorkMark(20, 200), WorkMark(5, 50)
    merged = plan(published)
    assert merged.action is AlignAction.CARRY and merged.unmerged_from == published and merged.dropped is None
    not_merged = plan(None)
    assert not_merged.action is AlignAction.CARRY and not_merged.unmerged_from == earlier
    waited = plan(now)
    assert waited.action is AlignAction.REPLACE and waited.unmerged_from == now  # nothing trained since the publish
    too_long = plan(None, room=24)
    assert too_long.action is AlignAction.DROP and too_long.unmerged_from == now
    assert too_long.dropped == WorkMark(25, 250)
    plain = plan(published, carry=False)
    assert plain.action is AlignAction.REPLACE and plain.unmerged_from == now  # the guide's rule: the commit replaces


def test_the_carry_limit_bounds_only_work_a_commit_passed_by_before():
    """INV-9: work trained on the anchor the commit follows is one version behind however long the commit
    took (a takeover): carried past max_carried_steps up to the room of the next contribution.
    Work from before the anchor (carried once already), or any when the commit skips versions,
    counts against max_carried_steps."""
    published = WorkMark(20, 200)
    assert plan(published, limit=3, room=10).action is AlignAction.CARRY  # 10 steps since the merged snapshot
    assert plan(published, limit=3, room=9).dropped == WorkMark(10, 100)  # more than the next contribution holds
    assert plan(None, anchor_step=8, limit=3).action is AlignAction.CARRY  # 3 steps carried from before the anchor
    assert plan(None, anchor_step=9, limit=3).action is AlignAction.DROP  # 4
    assert plan(published, versions_ahead=2, limit=9).action is AlignAction.DROP  # 10 steps, two versions behind


def test_the_carry_correction_is_the_commit_minus_where_the_work_began_in_fp32():
    committed = {"w": np.array([1.0, 2.0], np.float32)}
    start = {"w": np.array([0.25, 3.0], np.float16)}
    correction = align.carry_correction(committed, start)
    assert correction["w"].dtype == np.float32
    np.testing.assert_array_equal(correction["w"], [0.75, -1.0])
    local = np.array([0.5, 2.5], np.float32)  # θ + (θ_commit − θ_start) = θ_commit − (θ_start − θ)
    np.testing.assert_array_equal(local + correction["w"], committed["w"] - (start["w"].astype(np.float32) - local))


def test_the_exchange_computes_a_correction_ahead_only_when_the_learner_will_carry():
    assert align.expects_correction(carry=True, merged=False, overlap_steps=0)
    assert align.expects_correction(carry=True, merged=True, overlap_steps=None)
    assert not align.expects_correction(carry=True, merged=True, overlap_steps=0)  # it waited at its publish
    assert not align.expects_correction(carry=False, merged=False, overlap_steps=None)


def test_aligning_replaces_or_mixes(backend: Backend):
    local, committed = {"w": tensor(backend, [5.0, 5.0])}, {"w": tensor(backend, [4.0, 0.0])}
    assert aligned_parameters(backend, local, committed, mixing=0.0) is committed  # the guide's default: replace
    mixed = aligned_parameters(backend, local, committed, mixing=0.5)  # θ ← α·θ_local + (1 − α)·θ_commit
    np.testing.assert_allclose(values(backend, mixed["w"]), [4.5, 2.5])
