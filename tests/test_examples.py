"""The examples run as a user would run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.run_procs import run_torchrun

ROOT = Path(__file__).resolve().parent.parent


def test_synthetic_commits_equal_the_weighted_average():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "synthetic.py")], capture_output=True, text=True, timeout=120, check=True
    )
    diffs = [float(d) for d in re.findall(r"max\|diff\| ([0-9.e+-]+)", result.stdout)]
    assert len(diffs) >= 10
    assert max(diffs) < 1e-6
    assert re.search(r"max \|w - true_w\| = 0\.0\d", result.stdout)


def _torch_learner(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "torch_learner.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("GRADIENTMAIL_")} | (env or {}),
    )


@pytest.mark.slow
def test_torch_learner_trains_on_the_device_it_is_given(tmp_path):
    mailbox = (tmp_path / "mailbox").as_uri()
    knobs = ["--steps", "2", "--batch", "2", "--sync-every", "2", "--fragments", "2", "--log-every", "2"]
    result = _torch_learner("--mailbox", mailbox, "--learner-id", "a", *knobs, env={"GRADIENTMAIL_DEVICE": "cpu"})
    assert result.returncode == 0, result.stderr
    assert re.search(r"^a: [\d,]+ parameters on cpu,", result.stdout, re.MULTILINE), result.stdout
    assert "held-out loss" in result.stdout


@pytest.mark.slow
def test_examples_refuse_a_device_they_cannot_use(tmp_path):
    mailbox = (tmp_path / "mailbox").as_uri()
    bad = _torch_learner("--mailbox", mailbox, "--device", "gpu")
    assert bad.returncode == 2 and "GRADIENTMAIL_DEVICE='gpu' is not a device" in bad.stderr
    if not torch.cuda.is_available():
        missing = _torch_learner("--mailbox", mailbox, env={"GRADIENTMAIL_DEVICE": "cuda"})
        assert missing.returncode == 2 and "GRADIENTMAIL_DEVICE='cuda' but this PyTorch" in missing.stderr
    assert not (tmp_path / "mailbox").exists()  # refused before joining: no run was created


@pytest.mark.parametrize("example", ["torch_learner.py", "gpt2.py", "pythia.py"])
def test_torch_examples_take_device_defaulting_to_auto(example):
    source = (ROOT / "examples" / example).read_text()
    assert 'default=os.environ.get("GRADIENTMAIL_DEVICE", "auto")' in source
    assert "resolve_device(args.device)" in source and "torch.cuda.is_available()" not in source


@pytest.mark.slow
def test_torchrun_learner_trains_one_learner_of_two_ranks(tmp_path):
    """examples/torchrun_learner.py as its docstring says, on CPU: torchrun, two gloo ranks, one
    learner in the run."""
    mailbox = (tmp_path / "mailbox").as_uri()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(ROOT / "examples" / "torchrun_learner.py"), "--mailbox", mailbox, "--learner-id", "a",
        "--steps", "4", "--batch", "2", "--sync-every", "2", "--fragments", "2", "--log-every", "2",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADIENTMAIL_")} | {"OMP_NUM_THREADS": "1"}
    result = run_torchrun(command, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "a: step     4" in result.stdout
    from gradientmail.mailbox import FileMailbox
    from gradientmail.store import RunStore

    assert RunStore(FileMailbox(tmp_path / "mailbox")).leases.learners() == ["a"]


@pytest.mark.slow
def test_the_tensorboard_learner_writes_its_reported_scalars_and_alignments(tmp_path):
    """examples/tensorboard_learner.py: a listener turns session.report() and alignments into
    TensorBoard scalars, read back here with TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    command = [sys.executable, "examples/tensorboard_learner.py", "--mailbox", f"file://{tmp_path / 'box'}"]
    command += ["--logdir", str(tmp_path / "tb"), "--steps", "60"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    events = EventAccumulator(str(tmp_path / "tb" / "tb-0"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss", "lr", "samples_per_s"} <= tags
    assert any(tag.startswith("gradientmail/aligned_version/") for tag in tags)
    losses = events.Scalars("loss")
    assert len(losses) == 60 and losses[-1].step == 60 and losses[-1].value < losses[0].value


@pytest.mark.slow
def test_the_mlflow_learner_logs_its_reported_scalars_alignments_and_params(tmp_path):
    """examples/mlflow_learner.py: a listener turns session.report() and alignments into MLflow
    metrics in a local SQLite store, read back here with MLflow's own client."""
    import math

    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [sys.executable, "examples/mlflow_learner.py", "--mailbox", f"file://{tmp_path / 'box'}"]
    command += ["--tracking-uri", store, "--steps", "30"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("gradientmail").experiment_id])
    assert run.info.run_name == "mlflow-0" and run.info.status == "FINISHED"
    assert run.data.params == {"learner_id": "mlflow-0", "sync_every": "20", "fragments": "2"}
    assert {"loss", "lr", "samples_per_s"} <= run.data.metrics.keys()
    assert any(name.startswith("gradientmail/aligned_version/") for name in run.data.metrics)
    losses = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in losses] == list(range(1, 31))
    assert all(math.isfinite(m.value) for m in losses) and losses[-1].value < losses[0].value
