"""The merge note's numbers, on every backend: weights, the two merges, embeddings routing."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.algorithms.diloco import merge_tensors, rda, weight, weighted_mean
from gradientmail.backends import get_backend
from tests.backend_params import BACKENDS, tensor, values


@pytest.fixture(params=BACKENDS)
def backend(request):
    return get_backend(request.param)


def test_weight_table_is_exact():
    assert weight(12, 3072) == 786_432
    assert weight(6, 1536) == 393_216
    assert weight(12, 1536) == 196_608
    # squared as exact integers: no float rounding of a large sample count
    assert weight(3, 10**12) == (10**24) / 3


@pytest.mark.parametrize(
    "steps, samples, reason",
    [(0, 10, "zero_steps"), (-1, 10, "invalid_counts"), (2, -5, "invalid_counts"), (1.5, 3, "invalid_counts")],
)
def test_weight_rejects_bad_counts(steps, samples, reason):
    """INV-7: zero or invalid step and sample counts are rejected with their reason."""
    with pytest.raises(gm.ContributionRejected) as caught:
        weight(steps, samples)
    assert caught.value.reason == reason


# (deltas, weights, weighted mean, RDA): the "Small inputs" table
SMALL_INPUTS = [
    ([(1, 0), (3, 0)], [1, 1], (2, 0), (2, 0)),
    ([(1, 0), (0, 1)], [4, 1], (0.8, 0.2), (0.970, 0.243)),
    ([(3, 0), (0, 1)], [1, 1], (1.5, 0.5), (1.414, 1.414)),
    ([(1, 0), (-1, 0)], [2, 1], (0.333, 0), (1, 0)),
    ([(1, 0), (-1, 0)], [1.001, 1], (0.0005, 0), (1, 0)),
    ([(1, 0), (-1, 0)], [1, 1], (0, 0), (0, 0)),
    ([(0, 0), (1, 0)], [1, 1], (0.5, 0), (0.5, 0)),
]


@pytest.mark.parametrize("deltas, weights, expected_mean, expected_rda", SMALL_INPUTS)
def test_small_inputs_table(backend, deltas, weights, expected_mean, expected_rda):
    tensors = [tensor(backend, d) for d in deltas]
    mean = values(backend, weighted_mean(tensors, weights, backend))
    radial = values(backend, rda(tensors, weights, backend))
    np.testing.assert_allclose(mean, expected_mean, atol=5e-4)
    np.testing.assert_allclose(radial, expected_rda, atol=5e-4)
    assert backend.dtype_name(weighted_mean(tensors, weights)) == "float32"


def test_small_input_lengths(backend):
    pair = [tensor(backend, (1, 0)), tensor(backend, (0, 1))]
    assert np.linalg.norm(values(backend, weighted_mean(pair, [4, 1]))) == pytest.approx(0.825, abs=5e-4)
    assert np.linalg.norm(values(backend, rda(pair, [4, 1]))) == pytest.approx(1.0, abs=1e-6)
    pair = [tensor(backend, (3, 0)), tensor(backend, (0, 1))]
    assert np.linalg.norm(values(backend, weighted_mean(pair, [1, 1]))) == pytest.approx(1.581, abs=5e-4)
    assert np.linalg.norm(values(backend, rda(pair, [1, 1]))) == pytest.approx(2.0, abs=1e-6)
    # the longer delta pulls the weighted mean to 18.4° from its own direction; RDA lands at 45°
    mean = values(backend, weighted_mean(pair, [1, 1]))
    assert math.degrees(math.atan2(mean[1], mean[0])) == pytest.approx(18.4, abs=0.05)
    radial = values(backend, rda(pair, [1, 1]))
    assert math.degrees(math.atan2(radial[1], radial[0])) == pytest.approx(45.0, abs=1e-4)


def test_forty_degrees(backend):
    angle = math.radians(40)
    deltas = [tensor(backend, (math.cos(angle), math.sin(angle))), tensor(backend, (math.cos(angle), -math.sin(angle)))]
    mean = values(backend, weighted_mean(deltas, [1, 1]))
    radial = values(backend, rda(deltas, [1, 1]))
    assert np.linalg.norm(mean) == pytest.approx(0.766, abs=5e-4)
    assert np.linalg.norm(radial) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(radial, (1, 0), atol=1e-6)


@pytest.mark.parametrize("count, expected", [(2, 0.705), (4, 0.498), (8, 0.354)])
def test_random_unit_deltas(backend, count, expected):
    rng = np.random.default_rng(count)
    deltas = []
    for _ in range(count):
        direction = rng.standard_normal(100_000).astype(np.float32)
        deltas.append(tensor(backend, direction / np.linalg.norm(direction)))
    mean_length = np.linalg.norm(values(backend, weighted_mean(deltas, [1] * count)))
    assert mean_length == pytest.approx(expected, abs=0.01)
    assert mean_length == pytest.approx(1 / math.sqrt(count), rel=0.02)
    assert np.linalg.norm(values(backend, rda(deltas, [1] * count))) == pytest.approx(1.0, rel=1e-5)


def test_embedding_routing(backend):
    """mlp.weight goes through RDA, tok_embed.weight through the weighted mean (outer_lr=1, no momentum)."""
    anchor = {"mlp.weight": tensor(backend, (1, 1)), "tok_embed.weight": tensor(backend, (1, 1))}
    deltas = [
        {"mlp.weight": tensor(backend, (1, 0)), "tok_embed.weight": tensor(backend, (1, 0))},
        {"mlp.weight": tensor(backend, (0, 1)), "tok_embed.weight": tensor(backend, (0, 1))},
    ]
    weights = [weight(1, 2), weight(1, 1)]
    assert weights == [4, 1]
    merged = merge_tensors(gm.Rda(), deltas, weights, backend)
    outer = gm.NesterovOuter(lr=1.0, momentum=0.0)
    committed, _ = outer.step(backend, anchor, gm.OuterState.zeros(backend, anchor), merged)
    np.testing.assert_allclose(values(backend, committed["tok_embed.weight"]), (0.2, 0.8), atol=1e-6)
    # exactly 1 − (0.97014, 0.24254) = (0.02986, 0.75746); the note prints it as (0.030, 0.758)
    np.testing.assert_allclose(values(backend, committed["mlp.weight"]), (0.030, 0.758), atol=6e-4)
    np.testing.assert_allclose(values(backend, committed["mlp.weight"]), (1 - 4 / 17**0.5, 1 - 1 / 17**0.5), atol=1e-6)


def test_pattern_is_substring_of_lowercased_name():
    merge = gm.Rda()
    assert merge.uses_weighted_mean("gpt_neox.embed_in.weight")
    assert merge.uses_weighted_mean("embed_out.weight")
    assert merge.uses_weighted_mean("Tok_EMBED.weight")
    assert not merge.uses_weighted_mean("wte.weight") and not merge.uses_weighted_mean("wpe.weight")
    # the pattern itself is not lowercased: capitals match nothing
    assert not gm.Rda(direct_pattern="Embed").uses_weighted_mean("tok_embed.weight")
    assert gm.Rda(direct_pattern="tok_embeddings").uses_weighted_mean("model.tok_embeddings.weight")
    assert not gm.Rda(direct_pattern=None).uses_weighted_mean("tok_embed.weight")
    assert gm.WeightedMean().uses_weighted_mean("anything")


def test_one_contribution(backend):
    rng = np.random.default_rng(0)
    delta = tensor(backend, rng.standard_normal(1000))
    exact = values(backend, delta)
    assert np.array_equal(values(backend, weighted_mean([delta], [3.5])), exact)
    np.testing.assert_allclose(values(backend, rda([delta], [3.5])), exact, rtol=1e-6, atol=1e-7)


def test_identical_deltas_whatever_the_weights(backend):
    rng = np.random.default_rng(1)
    delta = tensor(backend, rng.standard_normal(500))
    out = values(backend, rda([delta, delta, delta], [1, 7.5, 1000]))
    np.testing.assert_allclose(out, values(backend, delta), rtol=1e-5, atol=1e-6)


def test_zero_delta_lowers_length_by_its_share(backend):
    rng = np.random.default_rng(2)
    direction = rng.standard_normal(300)
    delta = tensor(backend, direction)
    zero = tensor(backend, np.zeros(300))
    out = values(backend, rda([delta, zero], [3, 1]))
    length = np.linalg.norm(values(backend, delta))
    assert np.linalg.norm(out) == pytest.approx(0.75 * length, rel=1e-5)
    np.testing.assert_allclose(out / np.linalg.norm(out), direction / np.linalg.norm(direction), atol=1e-5)


def test_same_inputs_same_bytes(backend):
    """INV-4: on one backend the same inputs merge to the same bytes."""
    rng = np.random.default_rng(3)
    deltas = [
        {"a.weight": tensor(backend, rng.standard_normal((32, 16))), "embed.weight": tensor(backend, rng.standard_normal(64))}
        for _ in range(3)
    ]
    weights = [weight(10, 640), weight(5, 320), weight(10, 100)]
    first = backend.encode(merge_tensors(gm.Rda(), deltas, weights, backend))
    second = backend.encode(merge_tensors(gm.Rda(), deltas, weights, backend))
    assert first == second


def test_torch_and_mlx_agree():
    """INV-4: PyTorch and MLX agree within 1e-6 relative on a merge and outer step."""
    torch_backend, mlx_backend = get_backend("torch"), get_backend("mlx")
    rng = np.random.default_rng(4)
    raw = [
        {"blocks.0.mlp.weight": rng.standard_normal((64, 128)), "tok_embed.weight": rng.standard_normal((50, 16))}
        for _ in range(4)
    ]
    weights = [weight(12, 3072), weight(6, 1536), weight(12, 1536), weight(3, 700)]
    results = []
    for backend in (torch_backend, mlx_backend):
        deltas = [{k: tensor(backend, v) for k, v in d.items()} for d in raw]
        anchor = {k: tensor(backend, v) for k, v in raw[0].items()}
        merged = merge_tensors(gm.Rda(), deltas, weights, backend)
        params, state = gm.NesterovOuter().step(backend, anchor, gm.OuterState.zeros(backend, anchor), merged)
        results.append(
            {k: values(backend, v) for k, v in params.items()} | {f"m/{k}": values(backend, v) for k, v in state.momentum.items()}
        )
    for key in results[0]:
        np.testing.assert_allclose(results[0][key], results[1][key], rtol=1e-6, atol=1e-6 * np.abs(results[0][key]).max())


def test_merge_rejects_mismatched_inputs(backend):
    with pytest.raises(ValueError, match="weights"):
        weighted_mean([tensor(backend, (1, 0))], [1, 2])
    with pytest.raises(ValueError, match="sum to zero"):
        rda([tensor(backend, (1, 0))], [0])
    with pytest.raises(ValueError, match="at least one"):
        rda([], [])
