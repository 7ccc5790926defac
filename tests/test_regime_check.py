"""The one-line warning that a run loses work (``gradientmail status``, the main job), from round records."""

from __future__ import annotations

import gradientmail as gm
from gradientmail.regime import measure_work_loss, work_loss_hint
from gradientmail.store import RunStore
from tests.short_step_rounds import two_short_step_rounds


def _records(store: RunStore) -> list[gm.records.RoundRecord]:
    return [store.read_round(0, version) for version in store.committed_versions(0)]


def test_rounds_that_close_on_one_learner_of_many_are_named_with_the_setting_to_change():
    store = two_short_step_rounds("slack")
    loss = measure_work_loss(_records(store))
    assert (loss.rounds, loss.single_learner_rounds, loss.learners, loss.stale) == (2, 2, 2, 1)
    hint = work_loss_hint(loss, store.read_spec().algorithm)
    assert hint is not None
    assert "2 of 2 recent rounds merged one of 2 learners" in hint and "1 contribution came stale" in hint
    assert 'grace_rule="live"' in hint and "GRADIENTMAIL_GRACE_RULE=live" in hint


def test_a_run_whose_rounds_gather_every_learner_gets_no_warning():
    store = two_short_step_rounds("live")
    loss = measure_work_loss(_records(store), merged_share=1.0)
    assert not loss.losing and work_loss_hint(loss, store.read_spec().algorithm) is None


def test_a_low_merged_share_alone_warns_and_a_run_already_waiting_is_told_to_wait_longer():
    store = two_short_step_rounds("live")
    loss = measure_work_loss(_records(store), merged_share=0.9)
    hint = work_loss_hint(loss, gm.DiLoCo(grace_rule="live"))
    assert hint is not None and "90.0 % of learner steps merged" in hint and "grace_periods" in hint
