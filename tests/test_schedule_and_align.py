"""The learner's rules as pure functions: when a due fragment publishes, and the align/delta arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from gradientmail.algorithms import schedule
from gradientmail.algorithms.align import aligned_parameters, pseudo_gradient
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
    assert not schedule.must_wait_for_commit(steps_since_publish=100, overlap_steps=None)
    assert not schedule.must_wait_for_commit(steps_since_publish=1, overlap_steps=2)
    assert schedule.must_wait_for_commit(steps_since_publish=2, overlap_steps=2)
    assert schedule.must_wait_for_commit(steps_since_publish=0, overlap_steps=0)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    return get_backend(request.param)


def test_pseudo_gradient_is_anchor_minus_local_in_the_travel_dtype(backend: Backend):
    anchor, local = {"w": tensor(backend, [1.0, 2.0, 3.0])}, {"w": tensor(backend, [0.5, 2.5, 3.0])}
    delta = pseudo_gradient(backend, anchor, local, lambda name: "bfloat16")
    assert backend.dtype_name(delta["w"]) == "bfloat16"
    np.testing.assert_array_equal(values(backend, delta["w"]), [0.5, -0.5, 0.0])


def test_aligning_replaces_or_mixes(backend: Backend):
    local, committed = {"w": tensor(backend, [5.0, 5.0])}, {"w": tensor(backend, [4.0, 0.0])}
    assert aligned_parameters(backend, local, committed, mixing=0.0) is committed  # the guide's default: replace
    mixed = aligned_parameters(backend, local, committed, mixing=0.5)  # θ ← α·θ_local + (1 − α)·θ_commit
    np.testing.assert_allclose(values(backend, mixed["w"]), [4.5, 2.5])
