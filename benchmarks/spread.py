"""The syncer's load spread over the nodes: bytes per node, quality and commits against one syncer.

    python -m benchmarks.spread               # 8 learners, 8 fragments, 3 seeds (~15 minutes on 2 cores)
    python -m benchmarks.spread --quick       # 4 learners, 40 steps, one seed: a smoke run

Every arm runs real learner processes (``demo.worker``, the quality benchmark's model and data)
on a directory mailbox with ``fragments = learners`` and is scored by the held-out loss of the
model it ends with; the reference is the same run with ``syncer_layout="one"`` (the elected node
closes every fragment), on the same seed. Each node's syncer bytes are read back from the round
records: what its rounds downloaded (the merged contributions, at the run's mean contribution
size) and uploaded (each version's blobs).

Targets (issue 26): with ``syncer_layout="spread"`` the busiest node moves at most 1.5× the mean
node's syncer bytes (one syncer: all of them, ``learners``×); the final loss within 1 % of one
syncer's (same seed), with every learner step merged as often.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import gradientmail as gm
from benchmarks.arms import ROOT, SEED_STRIDE, Arm, gradientmail_arm
from benchmarks.targets import MIN_RUNS, at_most, information, verdict

TARGET_BUSIEST_RATIO = 1.5
TARGET_LOSS_RATIO = 1.01
SETTING = "syncer_layout=spread"


def busiest_over_mean(arm: Arm, learners: int) -> float:
    """The busiest node's syncer bytes over the mean over every node that runs a syncer."""
    loads = [arm.syncer_bytes_by_node.get(f"learner-{i + 1}", 0) for i in range(learners)]
    return max(loads) / (sum(loads) / learners) if sum(loads) else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spread", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 learners, 40 steps, one seed")
    parser.add_argument("--learners", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--sync-every", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"))
    args = parser.parse_args(argv)
    learners = args.learners or (4 if args.quick else 8)
    steps = args.steps or (40 if args.quick else 160)
    seeds = args.seeds or (1 if args.quick else MIN_RUNS)
    out = Path(args.runs_dir) / f"spread-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True)
    print(f"{learners} learners × {steps} steps, {learners} fragments, H = {args.sync_every}, {seeds} seeds; results in {out}")
    arms: dict[str, list[Arm]] = {"one": [], "spread": []}
    for seed in range(seeds):
        for layout in arms:
            algorithm = gm.DiLoCo(sync_every=args.sync_every, fragments=learners, syncer_layout=layout)  # type: ignore[arg-type]
            started = time.monotonic()
            arm = gradientmail_arm(
                f"syncer_layout={layout}", {}, "equal", [0.0] * learners, steps, out / f"{layout}-{seed}",
                algorithm=algorithm, seed=seed,
            )  # fmt: skip
            arms[layout].append(arm)
            loads = ", ".join(f"{n}: {b / 1e6:.1f}" for n, b in sorted(arm.syncer_bytes_by_node.items()))
            print(
                f"  seed {seed} {layout:6s}: loss {arm.val_loss:.4f}, merged {arm.merged_share:.3f}, "
                f"busiest ÷ mean {busiest_over_mean(arm, learners):.2f} (MB by node: {loads}) "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    one, spread = arms["one"], arms["spread"]
    verdicts = [
        verdict(
            f"busiest node's syncer bytes ÷ the mean ≤ {TARGET_BUSIEST_RATIO} ({learners} nodes, {learners} fragments)",
            [busiest_over_mean(a, learners) for a in spread], at_most(TARGET_BUSIEST_RATIO), setting=SETTING, judged_at=SETTING,
        ),
        information("the same with one syncer (the reference)", [busiest_over_mean(a, learners) for a in one]),
        verdict(
            f"loss ÷ one syncer's (same seed) ≤ {TARGET_LOSS_RATIO}",
            [s.val_loss / o.val_loss for s, o in zip(spread, one, strict=True)], at_most(TARGET_LOSS_RATIO),
            setting=SETTING, judged_at=SETTING,
        ),
        information(
            "merged share of learner steps, spread − one syncer (same seed)",
            [s.merged_share - o.merged_share for s, o in zip(spread, one, strict=True)],
        ),
    ]  # fmt: skip
    print()
    for v in verdicts:
        print(f"  {v.line()}")
    result = {
        "config": {"learners": learners, "steps": steps, "sync_every": args.sync_every, "seeds": seeds,
                   "seed_stride": SEED_STRIDE, "python": sys.version.split()[0]},
        "arms": {layout: [asdict(a) for a in found] for layout, found in arms.items()},
        "targets": [v.as_json() for v in verdicts],
        "median_busiest_spread": statistics.median(busiest_over_mean(a, learners) for a in spread),
    }  # fmt: skip
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out / 'result.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
