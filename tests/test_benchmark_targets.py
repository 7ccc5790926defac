"""Verdicts that cannot flatter (``benchmarks/targets.py``): "met" only on the median of three runs
at the target's own setting, and no benchmark spelling a verdict of its own."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.targets import DEFAULTS, MET, MISSED, check, conditions, information, verdict, within_noise

ROOT = Path(__file__).resolve().parent.parent
AT_MOST_ONE = lambda figure: figure <= 1.0  # noqa: E731


def test_a_figure_is_met_only_on_the_median_of_three_runs_at_the_defaults():
    assert verdict("t", [0.9, 0.8, 1.5], AT_MOST_ONE).met is True
    assert verdict("t", [1.2, 0.8, 1.5], AT_MOST_ONE).met is False  # the median, not the best run
    assert verdict("t", [0.5], AT_MOST_ONE).met is None  # one run
    assert verdict("t", [0.5, 0.6], AT_MOST_ONE).met is None  # two
    assert verdict("t", [2.0], AT_MOST_ONE).met is None  # a single run's miss is not a verdict either
    opt_in = verdict("t", [0.5, 0.5, 0.5], AT_MOST_ONE, setting="idle_poll_interval_s=TTL/3")
    assert opt_in.met is None and "measured at idle_poll_interval_s=TTL/3" in opt_in.line()
    named = verdict("t", [0.5, 0.5, 0.5], AT_MOST_ONE, setting="lock-step", judged_at="lock-step")
    assert named.met is True  # a target defined at another setting is judged there
    assert verdict("t", None, AT_MOST_ONE).met is None and verdict("t", [], AT_MOST_ONE).met is None
    assert verdict("t", 0.5, AT_MOST_ONE, runs=3).met is True  # one figure summarising three runs


def test_the_line_says_the_median_the_spread_and_where_it_came_from():
    line = verdict("round ≤ 1.3× floor", [1.2, 1.1, 1.4], lambda r: r <= 1.3).line("{:.2f}×")
    assert line == f"{MET} round ≤ 1.3× floor: median 1.20× (1.10×–1.40×, 3 runs)"
    assert verdict("x", [2.0, 3.0, 4.0], AT_MOST_ONE).line().startswith(MISSED)
    assert verdict("x", [0.5], AT_MOST_ONE).line().startswith("[information: 1 run, a verdict needs 3]")
    assert information("ref", [1.0, 2.0]).line().startswith("[information: a reference, not a target]")
    json.dumps(verdict("x", [1.0, 2.0, 3.0], AT_MOST_ONE, extra_field=1).as_json())


def test_a_condition_fails_on_one_run_and_passes_on_three():
    assert check("nothing lost", False).met is False
    assert check("nothing lost", True).met is None
    assert check("nothing lost", True, runs=3).met is True
    assert check("nothing lost", True, runs=3, setting="fast polling").met is None
    assert check("takeover", None).met is None
    assert [v.met for v in conditions([("a", True), ("b", False), ("c", None)], runs=1)] == [None, False, None]


def test_an_arm_beside_its_reference_is_judged_on_medians_against_the_larger_spread():
    reference = [2.30, 2.32, 2.31]  # spread 0.02
    assert within_noise("a", [2.31, 2.35, 2.32], reference).met is True  # medians 0.01 apart, noise 0.04
    assert within_noise("a", [2.40, 2.41, 2.42], reference).met is False  # 0.10 apart
    assert within_noise("a", [2.20, 2.21, 2.22], reference).met is False  # two-sided: better is a miss too
    assert within_noise("a", [2.20, 2.21, 2.22], reference, no_worse=True).met is True
    assert within_noise("a", [2.31, 2.32], reference[:2]).met is None  # two repeats: information
    assert within_noise("a", [2.31], [2.30]).met is None and "one repeat" in within_noise("a", [2.31], [2.30]).line()
    assert "medians +0.0100 apart, run-to-run noise 0.0400" in within_noise("a", [2.31, 2.35, 2.32], reference).line()


def _verdict_spellings(path: Path) -> list[str]:
    """String constants a verdict could be printed with; docstrings and keys read from a
    verdict's JSON (``t["met"]``) say nothing to a reader of the output."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            skipped.add(id(body[0].value))  # a docstring
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            skipped.add(id(node.slice))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            if text.lower() in {"met", "not met", "[met]", "[not met]"} or "NOT MET" in text or "[met]" in text:
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return found


def test_no_benchmark_spells_a_verdict_of_its_own():
    """Every "met" goes through benchmarks/targets.py, which gives it only on three runs at the
    target's setting; a module printing its own would bypass that."""
    spelled = [
        hit
        for path in sorted((ROOT / "benchmarks").glob("*.py"))
        if path.name not in {"targets.py"}
        for hit in _verdict_spellings(path)
    ]
    assert not spelled, spelled


@pytest.mark.slow
def test_the_merge_benchmark_judges_nothing_on_one_run_and_reports_both_copy_references(tmp_path):
    out = tmp_path / "merge.json"
    command = [sys.executable, "-m", "benchmarks.merge", "--mb", "1", "--m", "2", "--repeat", "1", "--no-mlx", "--no-old"]
    done = subprocess.run([*command, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert MET not in done.stdout and "[information: 1 run, a verdict needs 3]" in done.stdout
    saved = json.loads(out.read_text())
    assert saved["single_copy_bytes_per_s"] > 0 and saved["threaded_copy_bytes_per_s"] > 0
    assert all(t["met"] is None and t["runs"] == 1 and t["setting"] == DEFAULTS for t in saved["targets"])
    row = saved["results"][0]
    assert row["ratio_to_copy"] <= max(row["ratio_to_single_copy"], row["ratio_to_threaded_copy"]) + 1e-9


@pytest.mark.parametrize("name", ["iso_c"])
def test_a_timing_benchmark_judges_on_three_interleaved_pairs(tmp_path, name):
    out = tmp_path / f"{name}.json"
    command = [sys.executable, "-m", f"benchmarks.{name}", "--rows", "64", "--cols", "128", "--repeat", "3"]
    done = subprocess.run([*command, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    timings = json.loads(out.read_text())["timings"]
    assert timings and all(t["runs"] == 3 and t["met"] in (True, False) for t in timings)
