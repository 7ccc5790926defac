"""benchmarks.link end to end (its quick mode): every arm's learners inside one shaped link, the S3
server's own hops exempted, each arm's throughput against its bare loop and loss against
synchronous DiLoCo in its JSON, the plot written. Timing targets live in the benchmark, never here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.link import mlp_parameters, peer_steps
from benchmarks.peer_worker import build_model
from testing.shaped_link import unavailable
from tests.system_tools import tool_missing

ROOT = Path(__file__).resolve().parent.parent


def test_peer_steps_fit_the_budget_on_the_pipe_and_keep_one_exchange():
    parameters = mlp_parameters(1024)
    assert parameters == sum(p.numel() for p in build_model(1024).parameters())
    ring_s_at_100 = 2 * 3 * 4 * parameters * 8 / 100e6  # 4 learners' ring all-reduce through 100 Mbit/s
    steps = peer_steps(100, parameters, 4, 200, 20, budget_s=60)
    assert steps["ddp"] == int(60 // ring_s_at_100)  # one all-reduce per step
    assert steps["torchft"] == 200  # one per H = 20 steps: 10 of them fit
    thin = peer_steps(10, parameters, 4, 200, 20, budget_s=60)
    assert thin == {"ddp": 1, "torchft": 20}  # not even one fits: one exchange each, all the same
    assert peer_steps(100_000, parameters, 4, 200, 20, budget_s=60) == {"ddp": 200, "torchft": 200}


@pytest.mark.slow
@pytest.mark.s3
def test_quick_link_benchmark_runs_every_arm_through_the_pipe(tmp_path):
    why = unavailable()
    if why:
        tool_missing(why)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.link", "--quick", "--no-torchft", "--learners", "2",
         "--settings", "defaults,int4", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    names = [row["name"] for row in result["rows"]]
    assert names == ["data-parallel (DDP, gloo)", "GradientMail defaults", "GradientMail int4 both ways"]
    for row in result["rows"]:
        assert row["rate_mbit"] == 100 and row["throughput"] > 0 and row["crossed_mb"] > 0
    defaults, int4 = result["rows"][1], result["rows"][2]
    # one published delta, whichever node ran the syncer (which node does is timing): int4 is far smaller
    assert 0 < int4["extra"]["bytes_per_contribution"] < defaults["extra"]["bytes_per_contribution"] / 2
    # each learner's lease reading of what a period's transfers need came back with the run
    assert defaults["extra"]["period_need"] > 0 and int4["extra"]["period_need"] > 0
    assert (tmp_path / "link.png").stat().st_size > 0
    assert "100 Mbit/s: int4 final loss" in done.stdout
