"""Quality: does an asynchronous GradientMail run train as well as synchronous DiLoCo?

    python -m benchmarks.quality            # ~60 minutes on 2 cores (3 seeds)
    python -m benchmarks.quality --quick    # a smoke run: fewer steps, one mix
    python -m benchmarks.quality --regimes  # the regime matrix (benchmarks/regimes.py)

Every arm trains the demo's GPT on Shakespeare on the same number of samples and is scored
by the validation loss of the model it ends with, next to two references computed in the
same run: data-parallel training (one model, batch learners × batch) and synchronous
DiLoCo (an in-process lock-step loop, the same Nesterov outer step, no mailbox). The
GradientMail arms are real learner processes (``python -m demo.worker``) on a directory
mailbox. Two learner mixes: equal speed, and one learner at half speed (a sleep per step;
the in-process references do not depend on speed, so they run once).

Writes ``runs/quality-<time>/result.json`` and ``loss.png``; prints a table with the
targets of docs/benchmarks.md, each on the median over ``--seeds`` data seeds (default 3) of
its per-seed figure against the same seed's reference (``benchmarks/targets.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import torch

from benchmarks.arms import (
    ARMS,
    BATCH,
    EVAL_WINDOWS,
    LEARNERS,
    LR,
    ROOT,
    SPARSE_ARM,
    STEPS,
    SYNC_EVERY,
    Arm,
    data_parallel,
    dp_ratio,
    gradientmail_arm,
    step_time_s,
    sync_diloco,
)
from benchmarks.targets import MIN_RUNS, Verdict, at_least, at_most, verdict
from demo.model_config import GPTConfig

TARGET_DEFAULT_RATIO = 1.01
TARGET_MERGED_SHARE = 0.97
TARGET_QUORUM_ALL_RATIO = 1.005
TARGET_INT4_RATIO = 1.005
"""4-bit both ways within 0.5 % of the same run with fp32 deltas (the defaults arm)."""
TARGET_SPARSE_RATIO = 1.0
"""SparseLoCo's claim: sparse deltas end no worse than fp32 DiLoCo (the defaults arm, same seed)."""
TARGET_SPARSE_DP_RATIO = 5000.0
"""Sparse both ways: ≥ 5,000× fewer bytes than data-parallel at H = 100, both directions (issue 26)."""
TARGET_DP_BYTES_RATIO = 400.0
"""Bytes moved per learner ≥ 400× fewer than data-parallel at H = 100 (Streaming DiLoCo's figure)."""


def table(arms: list[Arm], syncs: dict[int, Arm]) -> list[str]:
    """Every arm, each divided by synchronous DiLoCo of its own data seed."""
    lines = [
        f"{'arm':<38} {'mix':<6} {'seed':>4} {'val loss':>8} {'÷ sync':>7} {'merged':>7} {'rounds':>6} {'per rnd':>7} "
        f"{'spread s':>8} {'stale':>5} {'wall s':>7} {'MB moved':>9} {'B/p up':>6} {'B/p dn':>6} {'÷DP H':>6} {'÷DP@100':>7}",
    ]
    for arm in arms:
        lines.append(
            f"{arm.name:<38} {arm.mix:<6} {arm.seed:4d} {arm.val_loss:8.4f} {arm.val_loss / syncs[arm.seed].val_loss:7.4f} "
            f"{arm.merged_share:7.3f} {arm.rounds:6d} {arm.participants_per_round:7.2f} {arm.arrival_spread_s:8.2f} "
            f"{arm.stale:5d} {arm.wall_s:7.0f} {arm.mailbox_bytes / 1e6:9.1f} {arm.up_bytes_per_param:6.3f} "
            f"{arm.down_bytes_per_param:6.3f} {dp_ratio(arm, SYNC_EVERY):6.0f} {dp_ratio(arm, 100):7.0f}"
        )
    return lines


def targets(arms: list[Arm], syncs: dict[int, Arm]) -> list[Verdict]:
    """The targets per learner mix, each on the median over data seeds of its per-seed figure
    (an arm against synchronous DiLoCo of the same seed, int4 against the defaults of the same
    seed); one seed is information (``benchmarks/targets.py``)."""
    verdicts = []
    for mix in dict.fromkeys(arm.mix for arm in arms):

        def runs(name: str, mix: str = mix) -> list[Arm]:
            return [a for a in arms if a.name == name and a.mix == mix]

        defaults = runs("GradientMail defaults")
        if defaults:
            ratios = [a.val_loss / syncs[a.seed].val_loss for a in defaults]
            verdicts.append(
                verdict(f"{mix}: defaults loss ÷ sync DiLoCo ≤ {TARGET_DEFAULT_RATIO}", ratios, at_most(TARGET_DEFAULT_RATIO))
            )
            verdicts.append(
                verdict(
                    f"{mix}: defaults merged share of learner steps ≥ {TARGET_MERGED_SHARE}",
                    [a.merged_share for a in defaults],
                    at_least(TARGET_MERGED_SHARE),
                )
            )
        everyone = runs("GradientMail quorum = learners")
        if everyone:
            verdicts.append(
                verdict(
                    f"{mix}: quorum = learners loss ÷ sync DiLoCo within {TARGET_QUORUM_ALL_RATIO - 1:.1%} of 1",
                    [a.val_loss / syncs[a.seed].val_loss for a in everyone],
                    lambda r: abs(r - 1) <= TARGET_QUORUM_ALL_RATIO - 1,
                    setting="quorum_size = learners",
                    judged_at="quorum_size = learners",
                )
            )
        quantized = runs("int4 deltas and commits")
        fp32 = {a.seed: a for a in defaults}
        pairs = [(q, fp32[q.seed]) for q in quantized if q.seed in fp32]
        if pairs:
            verdicts.append(
                verdict(
                    f"{mix}: int4 both ways ÷ fp32 deltas (the defaults, same seed) ≤ {TARGET_INT4_RATIO}",
                    [q.val_loss / d.val_loss for q, d in pairs],
                    at_most(TARGET_INT4_RATIO),
                    setting="int4 both ways",
                    judged_at="int4 both ways",
                )
            )
            verdicts.append(
                verdict(
                    f"{mix}: int4 both ways, × fewer bytes than data-parallel at H = 100 ≥ {TARGET_DP_BYTES_RATIO:.0f}",
                    [dp_ratio(q, 100) for q, _ in pairs],
                    at_least(TARGET_DP_BYTES_RATIO),
                    setting="int4 both ways",
                    judged_at="int4 both ways",
                )
            )
        sparse = [(q, fp32[q.seed]) for q in runs(SPARSE_ARM) if q.seed in fp32]
        if sparse:
            setting = "delta_sparsity 1/64, update_sparsity 4/64, plain step"
            verdicts.append(
                verdict(
                    f"{mix}: sparse both ways ÷ fp32 deltas (the defaults, same seed) ≤ {TARGET_SPARSE_RATIO:g}",
                    [q.val_loss / d.val_loss for q, d in sparse],
                    at_most(TARGET_SPARSE_RATIO),
                    setting=setting,
                    judged_at=setting,
                )
            )
            verdicts.append(
                verdict(
                    f"{mix}: sparse both ways, × fewer bytes than data-parallel at H = 100 ≥ {TARGET_SPARSE_DP_RATIO:.0f}",
                    [dp_ratio(q, 100) for q, _ in sparse],
                    at_least(TARGET_SPARSE_DP_RATIO),
                    setting=setting,
                    judged_at=setting,
                )
            )
    return verdicts


def plot(arms: list[Arm], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5))
    colours = {name: plt.get_cmap("tab10")(index) for index, name in enumerate(dict.fromkeys(arm.name for arm in arms))}
    styles = {"any": "-", "equal": "-", "half": "--"}  # the references solid and thick, the half-speed mix dashed
    for arm in arms:
        steps, losses = zip(*arm.curve, strict=True) if arm.curve else ((), ())
        label = f"{arm.name} ({arm.mix})" if arm.mix != "any" else arm.name
        width = 2.2 if arm.mix == "any" else 1.1
        axes.plot(steps, losses, label=label, color=colours[arm.name], linestyle=styles.get(arm.mix, ":"), linewidth=width)
    axes.set_xlabel("local step")
    axes.set_ylabel("training loss (nats, mean over learners)")
    axes.set_ylim(top=3.5)
    axes.legend(fontsize=7)
    axes.set_title(f"{LEARNERS} learners × batch {BATCH}, H = {SYNC_EVERY}, {STEPS} steps")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 steps, the equal-speed mix only, one seed: a smoke run")
    parser.add_argument(
        "--seeds", type=int, default=None, help="data seeds of every arm and reference (default 3, --quick 1); the median decides"
    )
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"))
    parser.add_argument("--arms", nargs="*", help="run only the GradientMail arms whose names contain one of these")
    parser.add_argument(
        "--regimes", action="store_true", help="the regime matrix instead (benchmarks/regimes.py): defaults in every regime"
    )
    parser.add_argument(
        "--straggler", action="store_true", help="time to lock-step DiLoCo's loss with speeds 1:1:2:4 (benchmarks/straggler.py)"
    )
    parser.add_argument("--only", nargs="*", help="with --regimes: only the regimes whose names contain one of these")
    parser.add_argument(
        "--knobs", default="{}", help="with --regimes: DiLoCo settings beyond the defaults, as JSON (a list: one matrix each)"
    )
    args = parser.parse_args(argv)
    if args.straggler:
        from benchmarks import straggler

        return straggler.main(Path(args.runs_dir), quick=args.quick, seeds=args.seeds)
    if args.regimes:
        from benchmarks import regimes

        return regimes.main(args.only, json.loads(args.knobs), Path(args.runs_dir), quick=args.quick, seeds=args.seeds)
    steps = 60 if args.quick else STEPS
    out = Path(args.runs_dir) / f"quality-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True)
    config = GPTConfig()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    slow_sleep = step_time_s(config) * max(1.0, LEARNERS / cores)
    torch.set_num_threads(cores)
    print(f"machine: {cores} cores; {LEARNERS} learners × {steps} steps × batch {BATCH}, H = {SYNC_EVERY}; results in {out}")
    seeds = 1 if args.quick and args.seeds is None else (args.seeds or MIN_RUNS)
    mixes = {"equal": [0.0] * LEARNERS}
    if not args.quick:
        mixes["half"] = [0.0] * (LEARNERS - 1) + [slow_sleep]
    syncs: dict[int, Arm] = {}
    references: list[Arm] = []
    arms: list[Arm] = []
    for seed in range(seeds):  # every stream of the run moves with the seed, the references' too
        syncs[seed] = sync_diloco(config, steps, seed=seed)
        references += [data_parallel(config, steps, seed=seed), syncs[seed]]
        print(
            f"  seed {seed}: synchronous DiLoCo {syncs[seed].val_loss:.4f} ({syncs[seed].wall_s:.0f} s), "
            f"data-parallel {references[-2].val_loss:.4f} ({references[-2].wall_s:.0f} s)",
            flush=True,
        )
        for mix, sleeps in mixes.items():
            for name, knobs in ARMS.items():
                if args.arms and not any(word in name for word in args.arms):
                    continue
                arm = gradientmail_arm(name, knobs, mix, sleeps, steps, out / f"{mix}-{len(arms)}", seed=seed)
                arms.append(arm)
                print(
                    f"  seed {seed}: {name} ({mix}): {arm.val_loss:.4f}, merged {arm.merged_share:.3f} ({arm.wall_s:.0f} s)",
                    flush=True,
                )
    everything = references + arms
    print()
    for line in table(everything, syncs):
        print(line)
    print()
    verdicts = targets(arms, syncs)
    for v in verdicts:
        print(f"  {v.line()}")
    plot([a for a in everything if a.seed == 0], out / "loss.png")
    result = {
        "machine": {"cores": cores, "torch": torch.__version__, "python": sys.version.split()[0]},
        "config": {"learners": LEARNERS, "steps": steps, "batch": BATCH, "sync_every": SYNC_EVERY, "lr": LR, "seeds": seeds,
                   "half_speed_sleep_s": slow_sleep, "eval_windows": EVAL_WINDOWS},
        "arms": [asdict(arm) for arm in everything],
        "targets": [v.as_json() for v in verdicts],
    }  # fmt: skip
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out / 'result.json'} and {out / 'loss.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
