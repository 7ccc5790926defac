"""The one-line warning that a run loses work (``gradientmail status``, the main job), from round records."""

from __future__ import annotations

import gradientmail as gm
from gradientmail.regime import carried_work_hint, measure_work_loss, work_loss_hint
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


def test_rounds_of_mostly_carried_work_are_named_with_the_setting_to_change(tmp_path):
    """Contributions trained mostly before their learner had the round's base: with the guide's
    fixed momentum the line names momentum_rule; with the damped rule, sync_every."""
    import numpy as np

    from gradientmail.backends import get_backend
    from gradientmail.session.join import RunProposal, join_run
    from gradientmail.store import ContributionCounts
    from gradientmail.syncer import SyncerRuntime

    numpy = get_backend("numpy")
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    spec, _ = join_run(store, numpy, {"w": np.zeros(4, np.float32)}, RunProposal(gm.DiLoCo(sync_every=20), lease_ttl_s=10.0), "a")
    syncer = SyncerRuntime(store, numpy, spec, "a", lease_ttl_s=10.0, poll_interval_s=0.2)
    for version in range(3):
        counts = ContributionCounts(20, 20, carried_steps=16)
        store.publish_contribution("a", 0, version, {"w": np.full(4, 0.01, np.float32)}, counts)
        syncer.run_once()
    loss = measure_work_loss(_records(store))
    assert loss.carried_share == 0.8
    fixed = carried_work_hint(loss, gm.DiLoCo(sync_every=20, momentum_rule="fixed"))
    assert fixed is not None and "80 % of the merged steps" in fixed and 'momentum_rule="damped"' in fixed
    damped = carried_work_hint(loss, gm.DiLoCo(sync_every=20))
    assert damped is not None and "sync_every (now 20)" in damped
    assert carried_work_hint(measure_work_loss(_records(two_short_step_rounds("live"))), gm.DiLoCo()) is None
