"""The spread benchmark runs end to end with real learner processes (a short smoke run): with
``syncer_layout="spread"`` several nodes commit, none carrying as large a share as the one syncer does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_spread_benchmark_spreads_the_commits_over_the_nodes(tmp_path):  # type: ignore[no-untyped-def]
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.spread", "--quick", "--learners", "3", "--steps", "30", "--sync-every", "10",
         "--runs-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "busiest node's syncer bytes ÷ the mean" in result.stdout and "[information: 1 run, a verdict needs 3]" in result.stdout
    )
    (run,) = tmp_path.iterdir()
    saved = json.loads((run / "result.json").read_text())
    (one,), (spread,) = saved["arms"]["one"], saved["arms"]["spread"]

    def busiest_share(arm: dict) -> float:  # type: ignore[type-arg]
        loads = arm["syncer_bytes_by_node"].values()
        return max(loads) / sum(loads)

    # one syncer: the elected node closes every fragment (another may have held the lease at the
    # start); spread: the fragments' rounds are closed by several nodes, none carrying as much
    assert len(spread["syncer_bytes_by_node"]) >= 2
    assert busiest_share(spread) < busiest_share(one), (spread["syncer_bytes_by_node"], one["syncer_bytes_by_node"])
    for arm in (one, spread):
        assert arm["rounds"] >= 1 and arm["val_loss"] < 5.0 and arm["merged_share"] > 0.5
