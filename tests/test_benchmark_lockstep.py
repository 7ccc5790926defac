"""The lock-step quality harness (benchmarks/lockstep_quality.py) measures the library's own code.

A smoke run of the CLI writes every arm with finite losses and the codecs' byte counts; one
round of the harness equals the library's merge, Nesterov step and compact update applied by
hand to independently trained replicas, so a harness that re-implemented (or mis-wired) any
of them would fail here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gradientmail as gm
from benchmarks import lockstep_quality as lq
from demo import model as torch_gpt
from demo.data import BatchSampler, load_corpus, validation_windows
from demo.model_config import GPTConfig
from gradientmail.algorithms.merge import merge_tensors
from gradientmail.backends.compact import compact_update
from gradientmail.backends.quantize import Codec, dequantize, quantize

ROOT = Path(__file__).resolve().parent.parent
LR, MOMENTUM = 0.9, 0.8  # not the defaults, so a harness ignoring the spec's outer step fails


@pytest.mark.slow
def test_quick_run_writes_every_arm_with_finite_losses_and_codec_bytes(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.lockstep_quality", "--quick", "--runs-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = tmp_path.iterdir()
    saved = json.loads((run / "result.json").read_text())
    arms = {arm["name"]: arm for arm in saved["groups"]["quick"]["arms"]}
    assert set(arms) == {"weighted mean, M=2", "Iso-C exact, M=2", "Iso-C exact, up int4 EF, down int4, M=2"}
    for arm in arms.values():
        assert math.isfinite(arm["val_loss"]) and arm["val_loss"] < 6.0 and arm["rounds"] == 2
        assert arm["name"] in result.stdout
    fp32 = arms["weighted mean, M=2"]
    assert fp32["up_bytes_per_param"] == fp32["down_bytes_per_param"] == 4.0
    assert fp32["dp_ratio_h100"] == pytest.approx(100.0)
    int4 = arms["Iso-C exact, up int4 EF, down int4, M=2"]
    numels = [p.numel() for p in torch_gpt.GPT(GPTConfig()).parameters()]
    exact = sum(Codec("int4").nbytes(n) for n in numels) / sum(numels)
    assert int4["up_bytes_per_param"] == int4["down_bytes_per_param"] == pytest.approx(exact)
    assert exact == pytest.approx(0.5 + 4 / 128, rel=1e-3)  # codes + one fp32 scale per 128
    assert int4["dp_ratio"] == pytest.approx(8 * 3 / (2 * exact))  # H = 3 in --quick
    assert int4["dp_ratio_h100"] == pytest.approx(800 / (2 * exact))


def _one_round_by_hand(setup: lq.Setup, replicas: int) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Initial parameters and each replica's pseudo-gradient (init − trained) after one round, without the harness."""
    init = torch_gpt.GPT(setup.config, seed=0)
    start = {name: p.detach().clone() for name, p in init.named_parameters()}
    deltas = []
    for seed in range(1, replicas + 1):
        model = torch_gpt.GPT(setup.config, seed=0)
        optimizer = torch_gpt.make_optimizer(model, setup.lr)
        sampler = BatchSampler(setup.tokens, setup.batch, setup.config.context, seed=seed)
        for _ in range(setup.sync_every):
            torch_gpt.train_step(model, optimizer, sampler.next())
        deltas.append({name: start[name] - p.detach() for name, p in model.named_parameters()})
    return start, deltas


@pytest.fixture(scope="module")
def setup() -> lq.Setup:
    config = GPTConfig()
    corpus = load_corpus()
    return lq.Setup(config, corpus.train, validation_windows(corpus.validation, 4, config.context), steps=3, sync_every=3)


def test_one_round_of_iso_c_is_the_library_merge_and_outer_step(setup: lq.Setup) -> None:
    spec = lq.ArmSpec("Iso-C", "test", 2, gm.IsoC(form="exact"), outer_lr=LR, outer_momentum=MOMENTUM)
    result = lq.lockstep(spec, setup)
    start, deltas = _one_round_by_hand(setup, 2)
    merged = merge_tensors(gm.IsoC(form="exact"), deltas, [1.0, 1.0])
    assert result.rounds == 1
    for name, value in start.items():
        expected = value - LR * (1 + MOMENTUM) * merged[name]  # from zero momentum: θ − η(1 + β)Δ
        torch.testing.assert_close(result.params[name], expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(result.master[name], result.params[name], rtol=0, atol=0)
    # Iso-C really flattened a matrix: the harness result differs from the weighted mean's.
    mean = merge_tensors(gm.WeightedMean(), deltas, [1.0, 1.0])
    name = "blocks.0.fc.weight"
    assert float((merged[name] - mean[name]).abs().max()) > 1e-4


def test_one_round_with_int4_both_ways_quantizes_what_is_sent_and_committed(setup: lq.Setup) -> None:
    up, down = Codec("int4"), Codec("int4", 256)
    spec = lq.ArmSpec("q", "test", 2, gm.Rda(), outer_lr=LR, outer_momentum=MOMENTUM, upload=up, download=down)
    result = lq.lockstep(spec, setup)
    start, deltas = _one_round_by_hand(setup, 2)
    received = [
        {n: torch.from_numpy(dequantize(*quantize(d.numpy(), up), up, tuple(d.shape))) for n, d in delta.items()}
        for delta in deltas
    ]
    merged = merge_tensors(gm.Rda(), received, [1.0, 1.0])
    for name, value in start.items():
        master = value - LR * (1 + MOMENTUM) * merged[name]
        torch.testing.assert_close(result.master[name], master, rtol=0, atol=1e-6)
        committed = compact_update(value.numpy(), result.master[name].numpy(), down)[1]
        np.testing.assert_array_equal(result.params[name].numpy(), committed)
    assert any(not torch.equal(result.params[n], result.master[n]) for n in start)  # the download was quantized


def test_error_feedback_carries_what_one_round_could_not_send() -> None:
    codec = Codec("int2")
    rng = np.random.default_rng(0)
    first, second = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    sent, residual = lq.send(first, codec, None, feedback=True)
    assert residual is not None and float(np.abs(residual).max()) > 0
    np.testing.assert_allclose(sent + residual, first, atol=1e-6)
    sent_next, residual_next = lq.send(second, codec, residual, feedback=True)
    assert residual_next is not None
    np.testing.assert_allclose(sent_next + residual_next, second + residual, atol=1e-6)
    plain, none = lq.send(first, codec, None, feedback=False)
    assert none is None
    np.testing.assert_array_equal(plain, sent)


def test_weighted_mean_arm_is_demo_reference_synchronous_diloco(setup: lq.Setup) -> None:
    """Without codecs, the harness's weighted-mean arm is the existing reference loop, bit for bit."""
    from demo.reference import synchronous_diloco

    two_rounds = lq.Setup(setup.config, setup.tokens, setup.validation, steps=4, sync_every=2)
    spec = lq.ArmSpec("wm", "test", 2, gm.WeightedMean(), outer_lr=LR, outer_momentum=MOMENTUM)
    result = lq.lockstep(spec, two_rounds)
    reference = synchronous_diloco(
        setup.config, setup.tokens, seeds=[1, 2], steps=4, sync_every=2, batch_size=setup.batch, lr=setup.lr,
        outer=gm.NesterovOuter(lr=LR, momentum=MOMENTUM),
    )  # fmt: skip
    for name, p in reference.model.named_parameters():
        torch.testing.assert_close(result.params[name], p.detach(), rtol=0, atol=0)
