"""`python -m benchmarks`: every benchmark it lists can be run, and nothing it lists measures nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import HELPERS, THROUGH, benchmarks

ROOT = Path(__file__).resolve().parent.parent


def test_every_listed_benchmark_has_a_command_line_or_names_the_one_it_runs_through():
    listed = benchmarks()
    assert not set(listed) & HELPERS
    for name in listed:
        source = (ROOT / "benchmarks" / f"{name}.py").read_text()
        runs_itself = 'if __name__ == "__main__":' in source
        assert runs_itself != (name in THROUGH), f"benchmarks/{name}.py: a command line of its own, or an entry in THROUGH"
        if name in THROUGH:
            assert 'if __name__ == "__main__":' in (ROOT / "benchmarks" / f"{THROUGH[name][0]}.py").read_text()


@pytest.mark.slow
def test_the_list_names_how_to_run_each():
    done = subprocess.run([sys.executable, "-m", "benchmarks", "list"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "regimes" in done.stdout and "(runs as: python -m benchmarks quality --regimes)" in done.stdout
    assert "  processes " not in done.stdout and "  targets " not in done.stdout
