"""The examples run as a user would run them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_synthetic_commits_equal_the_weighted_average():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "synthetic.py")], capture_output=True, text=True, timeout=120, check=True
    )
    diffs = [float(d) for d in re.findall(r"max\|diff\| ([0-9.e+-]+)", result.stdout)]
    assert len(diffs) >= 10
    assert max(diffs) < 1e-6
    assert re.search(r"max \|w - true_w\| = 0\.0\d", result.stdout)
