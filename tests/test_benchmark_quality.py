"""The quality benchmark runs end to end (a short smoke run): references, real learner processes, the table, JSON and plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_quality_benchmark_prints_every_arm_and_the_targets(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality", "--quick", "--runs-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for arm in ("data-parallel", "synchronous DiLoCo", "GradientMail defaults", "GradientMail quorum = learners"):
        assert arm in result.stdout
    assert "defaults loss ÷ sync DiLoCo" in result.stdout and "[information: 1 run, a verdict needs 3]" in result.stdout
    (run,) = tmp_path.iterdir()
    saved = json.loads((run / "result.json").read_text())
    arms = {arm["name"]: arm for arm in saved["arms"]}
    assert arms["synchronous DiLoCo"]["val_loss"] < 5.0  # it trained
    defaults = arms["GradientMail defaults"]
    assert defaults["rounds"] >= 1 and 0 < defaults["merged_share"] <= 1 and defaults["mailbox_bytes"] > 0
    int4 = arms["int4 deltas and commits"]
    assert 0 < int4["up_bytes_per_param"] < defaults["up_bytes_per_param"] / 6  # 4.25 bits against 32
    assert 0 < int4["down_bytes_per_param"] < defaults["down_bytes_per_param"] / 3  # compact commits, most of the time
    assert "int4 both ways" in result.stdout and "fewer bytes than data-parallel" in result.stdout
    sparse = arms["sparse deltas and commits, plain step"]  # SparseLoCo's form, both ways, real processes
    assert 0 < sparse["up_bytes_per_param"] < int4["up_bytes_per_param"] / 5  # 0.036 bytes a parameter against 0.53
    assert sparse["val_loss"] < 5.0 and "sparse both ways" in result.stdout
    assert (run / "loss.png").stat().st_size > 10_000


@pytest.mark.slow
def test_quick_regime_matrix_prints_each_regime_beside_its_references(tmp_path):
    """The regime matrix's smoke run: a short-step regime on a directory and one on a loopback S3
    server, each with synchronous DiLoCo and one learner alone at the same M, H and steps."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality", "--regimes", "--quick", "--runs-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "loss ÷ sync DiLoCo" in result.stdout and "one learner alone" in result.stdout
    assert "[information: 1 run, a verdict needs 3]" in result.stdout  # the smoke run has one seed
    (run,) = tmp_path.iterdir()
    saved = json.loads((run / "result.json").read_text())
    stores = {entry["regime"]["store"] for entry in saved["regimes"]}
    assert stores == {"directory", "s3"}
    for entry in saved["regimes"]:
        assert entry["sync"]["val_loss"] < 5.0 and entry["alone"]["val_loss"] < 5.0  # the references trained
        assert entry["arm"]["rounds"] >= 1 and 0 < entry["arm"]["merged_share"] <= 1 and entry["seed"] == 0
    assert len(saved["targets"]) == 3 * len(saved["regimes"])
    assert (run / "loss.png").stat().st_size > 10_000


@pytest.mark.slow
def test_quick_straggler_run_times_both_arms_to_lock_step_loss(tmp_path):
    """The time-to-loss smoke run: lock-step DiLoCo and the defaults at speeds 1:1:2:4, every
    committed version evaluated against its commit time, the ratio and its verdict printed."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality", "--straggler", "--quick", "--runs-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lock-step DiLoCo" in result.stdout and "[information: 1 run, a verdict needs 3]" in result.stdout
    (run,) = tmp_path.iterdir()
    saved = json.loads((run / "result.json").read_text())
    (seed,) = saved["seeds"]
    lock, ours = seed["arms"]
    assert lock["steps"] == [60] * 4 and ours["steps"] == [240, 240, 120, 60]  # the fast ones train on
    for arm in (lock, ours):
        times = [t for t, _, _ in arm["points"]]
        assert times == sorted(times) and times[0] == 0.0 and arm["points"][-1][1] >= 2  # versions in commit order
        assert arm["final_loss"] < 5.0
    assert (run / "seed-0" / "loss.png").stat().st_size > 10_000
