"""One entry point for the benchmarks: list them, run one, or run a suite and collect the misses.

    python -m benchmarks                  # what there is, one line each
    python -m benchmarks merge --mb 64    # one benchmark with its own arguments
    python -m benchmarks speed            # the speed suite (merge, transfers, round, goodput, torchft)

Each benchmark prints its own targets as met or not, next to a reference measured in the same
run, and writes its JSON result under runs/; a suite runs them one after another (they would
only disturb each other's timings side by side) and ends with every line that says NOT MET.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

from benchmarks.targets import MISSED

ROOT = Path(__file__).resolve().parent.parent
SUITES: dict[str, list[list[str]]] = {
    "speed": [["merge"], ["mailbox_throughput"], ["round"], ["step_overhead"], ["peer_torchft"]],
    "speed-quick": [
        ["merge", "--mb", "32"],
        ["mailbox_throughput", "--mb", "32", "--repeat", "2"],
        ["round", "--quick"],
        ["step_overhead", "--quick"],
        ["peer_torchft", "--quick"],
    ],
}
HELPERS = {"arms", "chaos_worker", "chaos_hostile", "chaos_ledger", "cpu", "peer_worker", "s3_requests", "timing", "targets"}
"""Modules of this package that other benchmarks use and that measure nothing themselves (the
harness shared with the tests is ``testing/``)."""
THROUGH: dict[str, list[str]] = {
    "regimes": ["quality", "--regimes"],
    "straggler": ["quality", "--straggler"],
    "bad_runs": ["bad_input"],
}
"""Benchmarks without a command line of their own: the one they run through."""


def benchmarks() -> dict[str, str]:
    """Every benchmark module and the first line of its docstring."""
    found = {}
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name.startswith("_") or module.name in HELPERS:
            continue
        doc = importlib.import_module(f"benchmarks.{module.name}").__doc__ or ""
        found[module.name] = doc.strip().splitlines()[0] if doc.strip() else ""
        if module.name in THROUGH:
            found[module.name] += f" (runs as: python -m benchmarks {' '.join(THROUGH[module.name])})"
    return dict(sorted(found.items()))


def run(name: str, args: list[str]) -> tuple[int, list[str]]:
    """Run one benchmark as its own process, echoing its output; its exit code and NOT MET lines."""
    module, *through = THROUGH.get(name, [name])
    command = [sys.executable, "-m", f"benchmarks.{module}", *through, *args]
    print(f"\n$ {' '.join(['python', *command[1:]])}", flush=True)
    misses = []
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            print(line, end="", flush=True)
            if MISSED in line:
                misses.append(f"{name}: {line.strip()}")
    return process.returncode, misses


def main(argv: list[str]) -> int:
    known = benchmarks()
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__.strip().splitlines()[0] + "\n")
        for name, line in known.items():
            print(f"  {name:<20} {line}")
        print("\nsuites: " + ", ".join(f"{s} ({', '.join(step[0] for step in steps)})" for s, steps in SUITES.items()))
        return 0
    if argv[0] in SUITES:
        steps = SUITES[argv[0]]
    elif argv[0] in known:
        steps = [argv]
    else:
        print(f"unknown benchmark or suite {argv[0]!r}; known: {', '.join([*known, *SUITES])}", file=sys.stderr)
        return 2
    failed, misses = [], []
    for name, *args in steps:
        code, missed = run(name, args)
        misses += missed
        if code != 0:
            failed.append(f"{name} (exit {code})")
    if len(steps) > 1:
        print("\n== summary ==")
        print("\n".join(misses) if misses else f"no line said {MISSED}")
        if failed:
            print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
