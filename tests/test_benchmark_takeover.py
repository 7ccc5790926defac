"""The failover benchmark runs end to end (its quick mode) and writes every stage × scenario ×
store it prints, no takeover before a TTL has passed since the dead node's last renewal (INV-6: leases are
never judged dead early). The TTL + one poll target lives in the benchmark
(``python -m benchmarks.takeover``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_takeover_times_each_scenario_on_each_store(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.takeover", "--quick", "--runs-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (result_file,) = tmp_path.glob("takeover-*/result.json")
    result = json.loads(result_file.read_text())
    scenarios = ("syncer", "learner", "spread-node", "spread-coordinator")
    stores = ("exact", "directory", "s3", "no stamps")
    stages = ("cold", "warm")
    assert set(result["runs"]) == {f"{stage}/{s}/{store}" for stage in stages for s in scenarios for store in stores}
    for times in result["runs"].values():  # never before the TTL has passed since the last renewal
        assert all(result["ttl_s"] - 1e-6 <= t < 2 * result["ttl_s"] for seed in times for t in seed), times
    assert len(result["targets"]) == 32 and "[information" in done.stdout
