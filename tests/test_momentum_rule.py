"""The outer momentum of each round (``DiLoCo.momentum_rule``, INV-18): β times the share of
the merged work trained on the round's base, the same in the live syncer and in replay."""

from __future__ import annotations

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.algorithms.outer import MergedWork, fresh_share, round_momentum
from gradientmail.backends import get_backend, payload
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, RunStore
from gradientmail.syncer import SyncerRuntime, replay_round

NUMPY = get_backend("numpy")


def test_the_fresh_share_weighs_each_contribution_as_the_merge_does() -> None:
    """INV-18: carried steps and stale contributions count as work not trained on the round's base."""
    assert fresh_share([MergedWork(1.0, 20, 0)]) == 1.0
    assert fresh_share([MergedWork(1.0, 20, 20)]) == 0.0
    assert fresh_share([MergedWork(3.0, 20, 5), MergedWork(1.0, 10, 10)]) == pytest.approx(3 * 0.75 / 4)
    assert fresh_share([MergedWork(1.0, 20, 0, staleness=1), MergedWork(1.0, 20, 0)]) == 0.5
    assert fresh_share([MergedWork(1.0, 5, 9)]) == 0.0  # carried beyond steps is all carried, never negative
    assert fresh_share([]) == 1.0 and fresh_share([MergedWork(0.0, 20, 20)]) == 1.0


def test_the_damped_rule_scales_beta_and_the_fixed_rule_keeps_it() -> None:
    """INV-18: β × the fresh share, or β; with nothing carried both are the guide's β."""
    work = [MergedWork(2.0, 20, 10), MergedWork(2.0, 20, 0)]
    assert round_momentum(0.9, "damped", work) == pytest.approx(0.9 * 0.75)
    assert round_momentum(0.9, "fixed", work) == 0.9
    assert round_momentum(0.9, "damped", [MergedWork(1.0, 20, 0)]) == 0.9  # lock-step: the guide's β


def test_defaults_damp_and_standard_diloco_keeps_the_guides_momentum() -> None:
    assert gm.DiLoCo().momentum_rule == "damped"
    assert gm.DiLoCo.standard(nodes=4).momentum_rule == "fixed"
    with pytest.raises(gm.InvalidConfig, match="momentum_rule"):
        gm.DiLoCo(momentum_rule="sometimes")  # type: ignore[arg-type]


def _model(value: float) -> dict[str, np.ndarray]:
    return {"mlp.weight": np.full((3, 2), value, np.float32)}


def _publish(
    store: RunStore, learner: str, version: int, base: dict[str, np.ndarray], delta: float, counts: ContributionCounts
) -> None:
    """A contribution of ``delta`` (anchor − local) in every element, against ``version``."""
    store.publish_contribution(learner, 0, version, {n: np.full_like(v, delta) for n, v in base.items()}, counts)


@pytest.mark.parametrize("rule", ["damped", "fixed"])
def test_a_round_of_carried_work_steps_with_the_rules_beta_states_it_and_replays(tmp_path, rule) -> None:
    """INV-18, INV-4: two rounds with momentum; the second merges work half carried. Its commit is
    the Nesterov step with β × the fresh share (damped) or β (fixed), its record states that β,
    and replay recomputes the committed bytes."""
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    algorithm = gm.DiLoCo(sync_every=10, merge=gm.WeightedMean(), momentum_rule=rule)
    spec, _ = join_run(store, NUMPY, _model(1.0), RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    syncer = SyncerRuntime(store, NUMPY, spec, "syncer", lease_ttl_s=10.0, poll_interval_s=0.2)
    v0 = store.load_version(spec, 0, 0).params
    _publish(store, "a", 0, v0, 0.5, ContributionCounts(10, 80))  # nothing carried
    syncer.run_once()
    first = store.read_round(0, 1)
    assert first.outer_momentum == pytest.approx(0.9)
    v1 = store.load_version(spec, 0, 1).params
    for learner in ("a", "b"):  # half of each one's steps carried across its alignment
        _publish(store, learner, 1, v1, 0.25, ContributionCounts(10, 80, carried_steps=5))
    syncer.run_once()
    second = store.read_round(0, 2)
    beta = 0.9 * 0.5 if rule == "damped" else 0.9
    assert second.outer_momentum == pytest.approx(beta)
    # by hand: m1 = Δ1; m2 = β·m1 + Δ2; θ2 = θ1 − η(Δ2 + β·m2), with Δ1 = 0.5, Δ2 = 0.25 (deltas point against the update)
    m2 = beta * 0.5 + 0.25
    expected = v1["mlp.weight"] - 0.7 * (0.25 + beta * m2)
    np.testing.assert_allclose(store.load_version(spec, 0, 2).params["mlp.weight"], expected, rtol=1e-6)
    replayed = replay_round(store, NUMPY, spec, 0, 2)
    assert payload.encode({n: NUMPY.to_numpy(t) for n, t in replayed.items()}) == store.blobs.read(second.params)
