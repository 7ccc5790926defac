"""DiLoCo configuration, manifest forms, the outer step, the fragment plan and schedule."""

from __future__ import annotations

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.algorithms.fragments import due_fragments, exchange_steps, plan_fragments
from gradientmail.backends import get_backend
from tests.backend_params import BACKENDS, tensor, values


def test_defaults_match_the_guide():
    config = gm.DiLoCo()
    assert (config.outer_lr, config.outer_momentum, config.quorum_size) == (0.7, 0.9, 1)
    assert config.merge == gm.Rda(direct_pattern="embed")
    assert config.delta_dtype is None
    # measured departures (docs/session.md), each one setting from the guide
    assert config.flush_on_close is True and config.momentum_rule == "damped" and config.grace_rule == "live"


def test_manifest_round_trip():
    """INV-8: the algorithm configuration round-trips through its manifest form."""
    config = gm.DiLoCo(sync_every=24, fragments=8, merge=gm.WeightedMean(), delta_dtype="bfloat16", overlap_steps=2)
    form = config.to_manifest()
    assert form["merge"] == {"kind": "weighted_mean"}
    assert gm.DiLoCo().to_manifest()["merge"] == {"kind": "rda", "direct_pattern": "embed"}
    assert gm.DiLoCo.from_manifest(form) == config
    assert gm.Rda.from_manifest({"kind": "rda", "direct_pattern": "embed"}) == gm.Rda()
    assert gm.WeightedMean.from_manifest({"kind": "weighted_mean"}) == gm.WeightedMean()


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(sync_every=-1), "sync_every"),
        (dict(sync_every=0), "sync_every"),
        (dict(fragments=0), "fragments"),
        (dict(merge={"kind": "median"}), "merge"),
        (dict(outer_lr=float("inf")), "outer_lr"),
        (dict(outer_momentum=1.0), "outer_momentum"),
        (dict(quorum_size=0), "quorum_size"),
        (dict(fragments=2, in_flight=3), "in_flight"),
        (dict(overlap_steps=-2), "overlap_steps"),
        (dict(delta_dtype="int8"), "delta_dtype"),
        (dict(grace_gamma=1.5), "grace_gamma"),
        (dict(mixing=1.0), "mixing"),
        (dict(sync_evrey=10), "sync_evrey"),
    ],
)
def test_invalid_settings_name_the_field(settings, field):
    with pytest.raises(gm.InvalidConfig) as caught:
        gm.DiLoCo(**settings)
    assert caught.value.field == field
    assert field in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_unknown_merge_kind_from_manifest():
    from gradientmail.algorithms.merge import merge_from_manifest

    with pytest.raises(gm.InvalidConfig, match="merge.kind.*'median'"):
        merge_from_manifest({"kind": "median"})
    with pytest.raises(gm.InvalidConfig, match="direct_pattern"):
        gm.Rda(direct_pattern="")


def test_standard_diloco_and_local_sgd_are_configurations():
    standard = gm.DiLoCo.standard(nodes=4)
    assert (standard.fragments, standard.in_flight, standard.overlap_steps, standard.quorum_size) == (1, 1, 0, 4)
    assert standard.merge == gm.WeightedMean()
    local = gm.DiLoCo.local_sgd(sync_every=50)
    assert (local.outer_lr, local.outer_momentum, local.merge) == (1.0, 0.0, gm.WeightedMean())


def test_run_config_leaves_out_learner_local_knobs():
    """INV-8: run fields are compared, learner-local knobs are not."""
    assert gm.DiLoCo(overlap_steps=0).run_config() == gm.DiLoCo().run_config()
    assert gm.DiLoCo(merge=gm.WeightedMean()).run_config() != gm.DiLoCo().run_config()


@pytest.mark.parametrize("name", BACKENDS)
def test_first_nesterov_step_moves_by_1_33_delta(name):
    backend = get_backend(name)
    params = {"w": tensor(backend, (1.0, -2.0))}
    delta = {"w": tensor(backend, (0.5, 0.25))}
    new, state = gm.NesterovOuter().step(backend, params, gm.OuterState.zeros(backend, params), delta)
    np.testing.assert_allclose(values(backend, new["w"]), np.array([1.0, -2.0]) - 1.33 * np.array([0.5, 0.25]), rtol=1e-6)
    np.testing.assert_allclose(values(backend, state.momentum["w"]), (0.5, 0.25))
    # second step: m = 0.9·m + Δ, θ -= 0.7·(Δ + 0.9·m)
    new2, state2 = gm.NesterovOuter().step(backend, new, state, delta)
    momentum = 0.9 * np.array([0.5, 0.25]) + np.array([0.5, 0.25])
    expected = values(backend, new["w"]) - 0.7 * (np.array([0.5, 0.25]) + 0.9 * momentum)
    np.testing.assert_allclose(values(backend, new2["w"]), expected, rtol=1e-6)


@pytest.mark.parametrize("name", BACKENDS)
def test_final_round_applies_theta_minus_delta_and_keeps_momentum(name):
    backend = get_backend(name)
    params = {"w": tensor(backend, (1.0, 1.0))}
    state = gm.OuterState(momentum={"w": tensor(backend, (0.3, 0.3))})
    new, new_state = gm.NesterovOuter().step(backend, params, state, {"w": tensor(backend, (0.25, -0.5))}, final=True)
    np.testing.assert_allclose(values(backend, new["w"]), (0.75, 1.5))
    np.testing.assert_allclose(values(backend, new_state.momentum["w"]), (0.3, 0.3))


@pytest.mark.parametrize("name", BACKENDS)
def test_bf16_parameters_keep_an_fp32_master(name):
    backend = get_backend(name)
    params = {"w": tensor(backend, (1.0,), "bfloat16")}
    state = gm.OuterState.zeros(backend, params)
    assert backend.dtype_name(state.master["w"]) == "float32"
    outer = gm.NesterovOuter(lr=1.0, momentum=0.0)
    tiny = {"w": tensor(backend, (-1e-3,))}  # below bf16's resolution at 1.0
    for _ in range(10):
        params, state = outer.step(backend, params, state, tiny)
    assert backend.dtype_name(params["w"]) == "bfloat16"
    assert values(backend, state.master["w"])[0] == pytest.approx(1.01, abs=1e-5)
    assert values(backend, params["w"])[0] == pytest.approx(1.0078125)  # nearest bf16 to 1.01


def test_outer_state_tensors_round_trip():
    backend = get_backend("numpy")
    params = {"a": np.ones(2, dtype=np.float16), "b": np.ones(3, dtype=np.float32)}
    state = gm.OuterState.zeros(backend, params)
    restored = gm.OuterState.from_tensors(state.to_tensors())
    assert set(restored.momentum) == {"a", "b"} and set(restored.master) == {"a"}


def test_staircase_schedule():
    assert [exchange_steps(p, 8, 100, 200) for p in range(8)] == [
        [12, 112],
        [25, 125],
        [37, 137],
        [50, 150],
        [62, 162],
        [75, 175],
        [87, 187],
        [100, 200],
    ]
    assert exchange_steps(0, 1, 100, 300) == [100, 200, 300]
    assert due_fragments(100, 8, 100) == [7] and due_fragments(13, 8, 100) == []
    assert due_fragments(0, 1, 100) == []


def test_fragment_plan_is_balanced_deterministic_and_ordered():
    sizes = [("embed.weight", 1000), ("h0.w", 300), ("h0.b", 10), ("h1.w", 300), ("h1.b", 10), ("head.w", 400)]
    plan = plan_fragments(sizes, 3)
    assert plan == plan_fragments(list(sizes), 3)
    assert sorted(n for f in plan.fragments for n in f) == sorted(n for n, _ in sizes)
    order = [n for n, _ in sizes]
    for names in plan.fragments:
        assert list(names) == sorted(names, key=order.index)
    firsts = [order.index(f[0]) for f in plan.fragments]
    assert firsts == sorted(firsts)
    loads = sorted(sum(dict(sizes)[n] for n in f) for f in plan.fragments)
    assert loads == [420, 600, 1000]  # largest first: 1000 | 400+10+10 | 300+300
    assert plan_fragments(sizes, 1).fragments == (tuple(order),)
    assert len(plan_fragments(sizes, 6)) == 6
    assert gm.FragmentPlan.from_manifest(plan.to_manifest()) == plan


def test_more_fragments_than_parameters_names_the_field():
    with pytest.raises(gm.InvalidConfig) as caught:
        plan_fragments([("a", 3), ("b", 4)], 3)
    assert caught.value.field == "fragments"


def test_public_api_is_as_documented():
    documented = {
        "DiLoCo",
        "Rda",
        "WeightedMean",
        "NesterovOuter",
        "OuterState",
        "FragmentPlan",
        "plan_fragments",
        "Backend",
        "backend_for",
        "get_backend",
        "GradientMailError",
        "InvalidConfig",
        "RunConfigMismatch",
        "MailboxError",
        "InvalidKey",
        "KeyNotFound",
        "RecordExists",
        "VersionConflict",
        "MailboxUnavailable",
        "MailboxMisconfigured",
        "CorruptPayload",
        "InvalidRecord",
        "BackendUnavailable",
        "NodeSettings",
        "session_from_env",
        "ContributionRejected",
        "__version__",
    }
    assert documented <= set(gm.__all__)
    for name in gm.__all__:
        assert hasattr(gm, name), name
    for name in gm.__all__:
        obj = getattr(gm, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, gm.GradientMailError), name


def test_every_error_says_whether_it_is_retryable():
    from gradientmail import errors

    for name in errors.__all__:
        error = getattr(errors, name)
        assert "retryable" in (error.__doc__ or "").lower(), f"{name}'s docstring does not say whether it is retryable"
    assert errors.MailboxUnavailable.retryable and not errors.RecordExists.retryable


def test_backend_errors_stay_in_the_error_tree():
    with pytest.raises(gm.InvalidConfig) as caught:
        gm.Session({"w": np.zeros(2, np.float32)}, mailbox=gm.MemoryMailbox(), learner_id="a", backend="jax")
    assert caught.value.field == "backend"
    with pytest.raises(gm.InvalidConfig, match="no backend recognises"):
        gm.Session(object(), mailbox=gm.MemoryMailbox(), learner_id="a")
