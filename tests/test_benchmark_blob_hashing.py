"""benchmarks/blob_hashing.py on a small blob: it runs, prints both sides and a ratio per size."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.s3
def test_the_benchmark_prints_the_mailbox_against_boto3_for_each_side() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.blob_hashing", "--sizes-mb", "4", "--repeats", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for side in ("write", "read"):
        assert any(re.fullmatch(rf"4 MB {side}: mailbox \d+ ms CPU, boto3 \d+ ms CPU, ratio [\d.]+x", line) for line in lines), (
            lines
        )
