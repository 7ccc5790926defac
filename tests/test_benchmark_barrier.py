"""The barrier benchmark runs end to end (a short smoke run): real processes on the loopback S3
server meet at barriers and it prints the spread of their returns beside its reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_barrier_benchmark_measures_the_spread_of_returns(tmp_path):  # type: ignore[no-untyped-def]
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.barrier", "--quick", "--runs-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "return within 50 ms of each other" in result.stdout and "the reference" in result.stdout
    (run,) = tmp_path.iterdir()
    saved = json.loads((run / "result.json").read_text())
    (found,) = saved["repeats"]
    assert len(found) == 2 and all(b["late"] == 0 and b["spread_s"] < 1.0 for b in found)
