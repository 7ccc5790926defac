"""Learners of two ranks against single-process learners of twice the batch, same run otherwise.

    python -m benchmarks.torchrun_quality                 # 2 learners, 200 steps, 3 repeats
    python -m benchmarks.torchrun_quality --steps 60 --repeats 1 --arms single,fsdp

Both arms train the demo GPT on Shakespeare with the same global batch per learner and the same
Decoupled DiLoCo settings, on a directory mailbox:

* groups: two learners, each ``torchrun --nproc-per-node 2 examples/torchrun_learner.py`` (DDP
  over gloo, ``--batch B`` per rank);
* fsdp: the same with ``--fsdp`` (parameters and optimizer state sharded by FSDP2);
* single: two learners, each ``examples/torch_learner.py --batch 2B`` (the reference).

Each arm's score is the held-out loss of the committed model its first learner evaluates after
closing. Repeats draw other learner ids (other data streams). Each arm is its median over the
repeats (min–max printed); the larger of the two arms' spreads over repeats is the run-to-run noise
the difference of the medians is judged against, and a verdict needs ``MIN_RUNS`` repeats.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.targets import MIN_RUNS, within_noise
from testing.processes import Hung, run_side_by_side

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("single", "groups", "fsdp")
HELD_OUT = re.compile(r"committed model, held-out loss ([0-9.]+)")


def _run(commands: list[list[str]], timeout: float) -> list[str]:
    """Run the learners side by side (``testing/processes.py``: a hang fails with every
    process's stacks); a learner that fails fails the run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADIENTMAIL_")} | {"OMP_NUM_THREADS": "1"}
    try:
        finished = run_side_by_side(commands, timeout, env=env)
    except Hung as hung:
        raise SystemExit(str(hung)) from None
    for done in finished:
        if done.returncode != 0:
            raise SystemExit(f"a learner failed ({done.returncode}):\n{done.output[-3000:]}")
    return [done.output for done in finished]


def arm(kind: str, repeat: int, args: argparse.Namespace, workdir: Path) -> tuple[float, float]:
    """One arm of one repeat: (held-out loss of the committed model, wall seconds)."""
    mailbox = (workdir / f"{kind}-{repeat}").as_uri()
    common = ["--mailbox", mailbox, "--steps", str(args.steps), "--sync-every", str(args.sync_every), "--fragments", "2"]
    common += ["--log-every", str(args.steps)]
    commands = []
    for learner in range(args.learners):
        name = ["--learner-id", f"r{repeat}-l{learner}"]
        if kind in ("groups", "fsdp"):
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
            sharding = ["--fsdp"] if kind == "fsdp" else []
            commands.append([*launcher, "examples/torchrun_learner.py", *name, *common, "--batch", str(args.batch), *sharding])
        else:
            commands.append([sys.executable, "examples/torch_learner.py", *name, *common, "--batch", str(2 * args.batch)])
    started = time.perf_counter()
    outputs = _run(commands, timeout=args.timeout)
    losses = [float(m[1]) for out in outputs if (m := HELD_OUT.search(out))]
    if not losses:
        raise SystemExit(f"{kind}: no held-out loss printed:\n{outputs[0][-2000:]}")
    return losses[0], time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8, help="per rank; the reference learners take twice this")
    parser.add_argument("--sync-every", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=MIN_RUNS)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--arms", default=",".join(ARMS), help="which arms, comma-separated (single is the reference)")
    args = parser.parse_args(argv)
    print(
        f"torchrun quality: {args.learners} learners, {args.steps} steps, batch {args.batch} x 2 ranks against "
        f"{2 * args.batch} x 1, H = {args.sync_every}, 2 fragments, {args.repeats} repeats, {os.cpu_count()} cores",
        flush=True,
    )
    arms = [arm_name.strip() for arm_name in args.arms.split(",")]
    if "single" not in arms or not set(arms) <= set(ARMS):
        parser.error(f"--arms: a list of {', '.join(ARMS)} that includes single (the reference)")
    results: dict[str, list[float]] = {kind: [] for kind in arms}
    with tempfile.TemporaryDirectory(prefix="gm-torchrun-quality-") as tmp:
        for repeat in range(args.repeats):
            for kind in arms:
                loss, wall = arm(kind, repeat, args, Path(tmp))
                results[kind].append(loss)
                print(f"  repeat {repeat}: {kind:6s} held-out loss {loss:.4f} ({wall:.0f} s)", flush=True)
    single = statistics.median(results["single"])
    spreads = {kind: max(losses) - min(losses) for kind, losses in results.items() if len(losses) > 1}
    print("\nspread over repeats: " + ", ".join(f"{kind} {spreads.get(kind, float('nan')):.4f}" for kind in arms))
    for kind in arms:
        if kind == "single":
            continue
        median = statistics.median(results[kind])
        low, high = min(results[kind]), max(results[kind])
        ratio = f"{median / single:.4f}x; difference {median - single:+.4f}"
        print(f"{kind} median {median:.4f} ({low:.4f}–{high:.4f}) / single {single:.4f} = {ratio}")
        judged = within_noise(f"{kind} against single", results[kind], results["single"])
        print(f"  {judged.line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
