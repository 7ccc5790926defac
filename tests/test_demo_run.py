"""The main job end to end: ``python -m demo --quick`` as ``./scripts/train`` runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
"""The repository root, where ``./scripts/train`` runs ``python -m demo``."""

_ROUND = re.compile(r"^round  f(\d+) v(\d+) +from v(\d+)  (.*)$", re.MULTILINE)


def _loss(output: str, label: str) -> float:
    match = re.search(rf"^  {re.escape(label)}.*?(\d+\.\d+)$", output, re.MULTILINE)
    assert match, f"no {label!r} row in:\n{output}"
    return float(match[1])


@pytest.mark.slow
def test_quick_demo_commits_rounds_and_learns(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "demo", "--quick", "--runs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout

    rounds = _ROUND.findall(output)
    assert len(rounds) >= 6, output  # several commits of each of the 3 fragments
    assert {int(fragment) for fragment, *_ in rounds} == {0, 1, 2}
    for _, version, base, participants in rounds:
        assert int(version) == int(base) + 1
        assert re.search(r"learner-\d w=\d\.\d\d", participants)
    assert re.search(r"^rounds +\d+ commits", output, re.MULTILINE)

    initial = _loss(output, "initial model")
    committed = _loss(output, "committed model at the end of the run")
    baseline = _loss(output, "single learner, no exchange")
    assert initial > 5.0
    assert committed < initial - 1.5
    assert baseline < initial - 1.5
    for learner in ("learner-1", "learner-2", "learner-3"):
        assert _loss(output, f"{learner}: committed model when it left") < initial - 1.5

    run_dirs = list(tmp_path.iterdir())
    assert len(run_dirs) == 1
    assert (run_dirs[0] / "mailbox" / "manifest.json").is_file()
    assert list((run_dirs[0] / "mailbox" / "fragments" / "0000" / "rounds").glob("*.json"))
