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
    assert "× sync DiLoCo" in result.stdout and ("[met]" in result.stdout or "[NOT MET]" in result.stdout)
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
    assert (run / "loss.png").stat().st_size > 10_000
