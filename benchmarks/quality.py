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
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gradientmail as gm
from benchmarks.processes import run_side_by_side
from benchmarks.seaweed import S3Endpoint
from benchmarks.targets import MIN_RUNS, Verdict, at_least, at_most, verdict
from demo import model as torch_gpt
from demo import settings
from demo.data import BatchSampler, load_corpus, validation_windows
from demo.model_config import DEFAULT_CONFIG, GPTConfig
from demo.reference import synchronous_diloco
from demo.trainer import build_trainer
from gradientmail.store import RunStore

# -- configuration ---------------------------------------------------------------------------
LEARNERS = 4
STEPS = 300
SEED_STRIDE = 100
"""Data seed ``s`` shifts every batch stream of a run (learners, references) by ``s × 100``."""
BATCH = 16
SYNC_EVERY = 50
LR = settings.LEARNING_RATE
EVAL_WINDOWS = 256
ROOT = Path(__file__).resolve().parent.parent

SPARSE_ARM = "sparse deltas and commits, plain step"
"""SparseLoCo's form (docs/algorithms.md): top-64-of-4096 int2 deltas with error feedback, commits
carrying the merged deltas' union (``update_sparsity = learners × delta_sparsity``, int4), the
plain outer step that measured better than Nesterov with sparse deltas."""
ARMS: dict[str, dict[str, Any]] = {
    "GradientMail defaults": {},
    "GradientMail quorum = learners": {"quorum_size": LEARNERS},
    "guide: aligning drops unmerged work": {"carry_unmerged": False},
    "alternative: mixing 0.5, no carry": {"carry_unmerged": False, "mixing": 0.5},
    "alternative: late deltas, staleness 1": {"carry_unmerged": False, "max_staleness": 1},
    "int4 deltas and commits": {"delta_quantization": "int4", "update_quantization": "int4"},
    SPARSE_ARM: {"delta_sparsity": 1 / 64, "update_sparsity": LEARNERS / 64, "outer_lr": 1.0, "outer_momentum": 0.0},
}
"""DiLoCo settings of each GradientMail arm beyond sync_every and fragments=1; {} is every default."""

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
ARM_TIMEOUT_S = 1800.0
"""An arm's learners that outlive this fail with their stacks (the slowest arm measured took 598 s)."""
DP_BYTES_PER_PARAM_STEP = 8.0
"""fp32 ring all-reduce: each learner sends and receives ≈ 2 × 4 bytes per parameter per step."""


@dataclass
class Arm:
    name: str
    mix: str
    val_loss: float
    wall_s: float
    merged_share: float = 1.0
    rounds: int = 0
    mailbox_bytes: int = 0
    stale: int = 0
    carried_steps: int = 0
    participants_per_round: float = 0.0
    arrival_spread_s: float = 0.0
    """Median seconds between a round's first and last accepted contribution."""
    grace_s: float = 0.0
    """Median grace window the syncer allowed."""
    steps_per_s: dict[str, float] = field(default_factory=dict)
    up_bytes_per_param: float = 0.0
    """Bytes a learner published per parameter per H steps it trained."""
    down_bytes_per_param: float = 0.0
    """Bytes a learner fetched per parameter per H steps it trained."""
    curve: list[tuple[int, float]] = field(default_factory=list)
    """(step, training loss) points for the plot."""
    seed: int = 0
    """Which data seed (``SEED_STRIDE`` apart: every batch stream of the run moves with it)."""
    syncer_bytes_by_node: dict[str, int] = field(default_factory=dict)
    """Bytes each committing node moved for its rounds: the merged contributions down (at the
    run's mean contribution size) and the versions' blobs up."""


def validation(config: GPTConfig) -> tuple[np.ndarray, np.ndarray]:
    return validation_windows(load_corpus().validation, EVAL_WINDOWS, config.context)


def single_learner(config: GPTConfig, steps: int, *, seed: int = 0) -> Arm:
    """One learner alone, batch BATCH, no exchange: what a learner gets without the others (the
    floor every asynchronous arm must beat)."""
    started = time.monotonic()
    trainer = build_trainer("torch", config, LR)
    sampler = BatchSampler(load_corpus().train, BATCH, config.context, seed=1 + seed * SEED_STRIDE)
    losses = [trainer.step(sampler.next()) for _ in range(steps)]
    wall = time.monotonic() - started
    return Arm("one learner alone", "any", trainer.evaluate(validation(config)), wall, curve=_curve(losses), seed=seed)


def data_parallel(config: GPTConfig, steps: int, *, seed: int = 0) -> Arm:
    """One model, batch learners × BATCH: what synchronous data-parallel training computes."""
    started = time.monotonic()
    trainer = build_trainer("torch", config, LR)
    sampler = BatchSampler(load_corpus().train, LEARNERS * BATCH, config.context, seed=1000 + seed * SEED_STRIDE)
    losses = [trainer.step(sampler.next()) for _ in range(steps)]
    wall = time.monotonic() - started
    return Arm("data-parallel", "any", trainer.evaluate(validation(config)), wall, curve=_curve(losses), seed=seed)


def sync_diloco(config: GPTConfig, steps: int, learners: int = LEARNERS, sync_every: int = SYNC_EVERY, *, seed: int = 0) -> Arm:
    started = time.monotonic()
    result = synchronous_diloco(
        config,
        load_corpus().train,
        seeds=range(1 + seed * SEED_STRIDE, learners + 1 + seed * SEED_STRIDE),
        steps=steps,
        sync_every=sync_every,
        batch_size=BATCH,
        lr=LR,
        outer=gm.NesterovOuter(lr=0.7, momentum=0.9),
    )
    loss = torch_gpt.evaluate(result.model, validation(config))
    wall = time.monotonic() - started
    return Arm("synchronous DiLoCo", "any", loss, wall, rounds=result.rounds, curve=_curve(result.losses), seed=seed)


def _curve(losses: list[float], every: int = 10) -> list[tuple[int, float]]:
    return [(end, float(np.mean(losses[end - every : end]))) for end in range(every, len(losses) + 1, every)]


def gradientmail_arm(
    name: str,
    knobs: dict[str, Any],
    mix: str,
    sleeps: list[float],
    steps: int | Sequence[int],
    workdir: Path,
    *,
    sync_every: int = SYNC_EVERY,
    config: GPTConfig = DEFAULT_CONFIG,
    s3: S3Endpoint | None = None,
    algorithm: gm.DiLoCo | None = None,
    worker_args: Sequence[Sequence[str]] | None = None,
    beside: Callable[[str], subprocess.Popen[str]] | None = None,
    seed: int = 0,
) -> Arm:
    """Real learner processes (one per entry of ``sleeps``, each sleeping that long after every
    step, training ``steps`` steps or its own entry of them) through a directory mailbox, or a
    bucket prefix of ``s3``; the committed model is evaluated here. ``algorithm`` replaces
    ``gm.DiLoCo(sync_every=sync_every, fragments=1, **knobs)``. ``worker_args``: more arguments
    of each learner's ``demo.worker``; ``beside``: a process started with the mailbox URL next
    to the learners (a dedicated syncer) and stopped with SIGTERM once they are done."""
    if algorithm is None:
        algorithm = gm.DiLoCo(sync_every=sync_every, fragments=1, **knobs)
    learner_steps = [steps] * len(sleeps) if isinstance(steps, int) else list(steps)
    box_dir = workdir / "mailbox"
    box_dir.mkdir(parents=True)
    url = f"file://{box_dir}" if s3 is None else s3.url(f"{workdir.name}-{time.time_ns()}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(s3.env if s3 is not None else {})}
    started = time.monotonic()
    side = beside(url) if beside is not None else None
    commands = []
    for index, sleep in enumerate(sleeps):
        commands.append([
            sys.executable, "-m", "demo.worker", "--mailbox", url, "--learner-id", f"learner-{index + 1}",
            "--steps", str(learner_steps[index]), "--seed", str(index + 1 + seed * SEED_STRIDE),
            "--batch-size", str(BATCH), "--lr", str(LR),
            "--algorithm", json.dumps(algorithm.to_manifest()), "--step-sleep", str(sleep), "--eval-windows", "8",
            "--model", json.dumps(asdict(config)),
            "--keep-versions", "1000000",  # keep every round: every step is accounted for afterwards
            *(worker_args[index] if worker_args is not None else []),
        ])  # fmt: skip
    logs = [workdir / f"learner-{index + 1}.log" for index in range(len(sleeps))]
    try:
        finished = run_side_by_side(commands, ARM_TIMEOUT_S, env=env, logs=logs)
    finally:
        if side is not None:
            side.terminate()
            side.wait(timeout=60)
    events = [[json.loads(line) for line in done.output.splitlines() if line.startswith("{")] for done in finished]
    wall = time.monotonic() - started
    for index, done in enumerate(finished):
        if done.returncode != 0:
            raise RuntimeError(f"learner-{index + 1} exited with {done.returncode}: see {workdir}")
    finals = [next(e for e in learner if e["event"] == "final") for learner in events]
    progress = [[(e["step"], e["loss"]) for e in learner if e["event"] == "progress"] for learner in events]

    mailbox = gm.FileMailbox(box_dir) if s3 is None else _open_s3(url, s3)
    store = RunStore(mailbox)
    spec = store.read_spec()
    fragments = range(len(spec.fragments))
    newest = [store.newest_version(f) or 0 for f in fragments]
    records = [store.read_round(f, version) for f in fragments for version in range(1, newest[f] + 1)]
    model = torch_gpt.GPT(config)
    backend = gm.get_backend("torch")
    params = {n: a for f in fragments for n, a in store.load_version(spec, f, newest[f]).params.items()}
    backend.write_parameters(model, {n: backend.from_numpy(a) for n, a in params.items()})
    mailbox.close()

    merged = sum(p.steps for r in records for p in r.participants) / len(fragments)  # every fragment merges every step
    published = sum(f["bytes_published"] for f in finals)
    contribution_bytes = published / max(1, sum(f["contributions"] for f in finals))  # over every fragment's
    by_node: dict[str, int] = {}
    for r in records:  # what its committer downloaded (the merged contributions) and uploaded (the version's blobs)
        written = r.params.size_bytes + r.outer_state.size_bytes + (r.update.size_bytes if r.update is not None else 0)
        by_node[r.committed_by] = by_node.get(r.committed_by, 0) + written + int(contribution_bytes * len(r.participants))
    syncer_bytes = sum(by_node.values())
    learner_bytes = sum(f["bytes_published"] + f["bytes_fetched"] for f in finals)
    # per learner per H steps it trained (a round of data-parallel's comparison), whatever the rounds committed
    per_learner_round = sum(learner_steps) / algorithm.sync_every * sum(p.numel for p in spec.parameters.values())
    by_step: dict[int, list[float]] = {}
    for points in progress:
        for step, loss in points:
            by_step.setdefault(step, []).append(loss)
    return Arm(
        name, mix, torch_gpt.evaluate(model, validation(config)), wall,
        merged_share=merged / sum(learner_steps), rounds=round(float(np.mean(newest))),
        mailbox_bytes=learner_bytes + syncer_bytes, syncer_bytes_by_node=by_node,
        stale=sum(1 for r in records for x in r.rejected if x.reason == "stale"),
        carried_steps=sum(p.carried_steps for r in records for p in r.participants),
        participants_per_round=float(np.mean([len(r.participants) for r in records])),
        arrival_spread_s=float(np.median([r.timing.arrival_spread_s for r in records])),
        grace_s=float(np.median([r.timing.grace_s for r in records])),
        steps_per_s={f"learner-{i + 1}": round(f["steps"] / max(f["elapsed_s"], 1e-9), 2) for i, f in enumerate(finals)},
        up_bytes_per_param=sum(f["bytes_published"] for f in finals) / per_learner_round,
        down_bytes_per_param=sum(f["bytes_fetched"] for f in finals) / per_learner_round,
        curve=[(step, float(np.mean(losses))) for step, losses in sorted(by_step.items())], seed=seed,
    )  # fmt: skip


def _open_s3(url: str, s3: S3Endpoint) -> gm.Mailbox:
    """The run's mailbox on the loopback server; its credentials go into this process's
    environment, the standard place (s3:// URLs carry none), as they did for the learners."""
    os.environ.update(s3.env)
    return gm.open_mailbox(url)


def step_time_s(config: GPTConfig) -> float:
    """Seconds of one learner step on one thread, measured: the half-speed learner sleeps this much
    times the learners sharing each core, so it runs at about half the others' speed."""
    torch.set_num_threads(1)
    trainer = build_trainer("torch", config, LR)
    sampler = BatchSampler(load_corpus().train, BATCH, config.context, seed=0)
    trainer.step(sampler.next())
    started = time.perf_counter()
    for _ in range(10):
        trainer.step(sampler.next())
    return (time.perf_counter() - started) / 10


def dp_ratio(arm: Arm, sync_every: int) -> float:
    """Data-parallel's bytes per learner over ours for the same steps, at sync period ``sync_every``
    (a round's bytes do not depend on H; data-parallel moves 8 bytes per parameter every step)."""
    ours = arm.up_bytes_per_param + arm.down_bytes_per_param
    return DP_BYTES_PER_PARAM_STEP * sync_every / ours if ours else float("inf")


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
