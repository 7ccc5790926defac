"""Time to loss with a straggler: the reason to be asynchronous.

    python -m benchmarks.quality --straggler           # 3 data seeds, ~7 minutes each on 2 cores
    python -m benchmarks.quality --straggler --seeds 1 # one seed (information only)
    python -m benchmarks.quality --straggler --quick   # a smoke run: the short-step GPT, 60 steps, one seed

Four learners at speeds 1:1:2:4 (slowness by a sleep per step, so it costs no CPU), as real
processes through a directory mailbox, in two arms:

* **lock-step DiLoCo**, ``gm.DiLoCo.standard(nodes=4)``: every learner trains ``STEPS`` steps
  and waits at every sync for the slowest. Its committed model's final loss is the target,
  and its wall time the reference.
* **GradientMail's defaults**, ``gm.DiLoCo(sync_every=H, fragments=1)``: nobody waits; each
  learner trains ``STEPS`` × (slowest speed ÷ its own) steps, so all of them stop at about the
  time the slowest ends its ``STEPS``.

Both arms keep every version; afterwards each committed version is evaluated on the held-out
windows at its commit time (seconds since version 0 was created, the same origin in both arms).
The figure is the wall time GradientMail's committed model takes to reach lock-step DiLoCo's
final loss, divided by lock-step DiLoCo's own wall time (target ≤ 0.7, on the median over the
data seeds; a seed that never reaches it counts as infinite). The in-process
synchronous DiLoCo of the regime matrix (``STEPS`` each, no mailbox, no waiting) is printed
beside it, with the time the defaults take to reach its loss too. ``gm.DiLoCo.standard``'s
rounds wait for every learner, and a learner short of its period joins a round the others
opened with the steps it has (the quorum rule of the protocol), so its slowest learner ends
its steps alone in the last rounds; that is the lock-step run a user of this library gets.
Writes ``runs/straggler-<time>/result.json`` and ``loss.png``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

import gradientmail as gm
from benchmarks import arms
from benchmarks.regimes import SHORT_STEP_MODEL, Regime, sleeps_for
from benchmarks.targets import DEFAULTS, MIN_RUNS, at_most, verdict
from demo import model as torch_gpt
from demo.model_config import DEFAULT_CONFIG, GPTConfig
from gradientmail.store import RunStore

SPEEDS = (1.0, 1.0, 2.0, 4.0)
STEPS = 300
SYNC_EVERY = 50
QUICK_STEPS, QUICK_SYNC_EVERY = 60, 20
TARGET_TIME_RATIO = 0.7
MAX_EVALUATIONS = 40
"""Committed versions evaluated per arm (evenly spaced, the newest always)."""


@dataclass
class Timeline:
    """One arm's committed model over time."""

    arm: str
    steps: list[int]
    wall_s: float
    """Seconds from version 0 to the newest commit."""
    final_loss: float
    merged_share: float
    points: list[tuple[float, int, float]]
    """(seconds since version 0, version, held-out loss) of the versions evaluated."""

    def time_to(self, loss: float) -> float | None:
        """When the committed model first reached ``loss``; None if it never did."""
        return next((t for t, _, value in self.points if value <= loss), None)


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def committed_timeline(box_dir: Path, config: GPTConfig) -> list[tuple[float, int, float]]:
    """(seconds since version 0, version, held-out loss) of up to ``MAX_EVALUATIONS`` versions."""
    store = RunStore(gm.FileMailbox(box_dir))
    spec = store.read_spec()
    newest = store.newest_version(0)
    assert newest is not None
    stride = max(1, -(-newest // (MAX_EVALUATIONS - 1)))
    versions = sorted({*range(0, newest + 1, stride), newest})
    origin = _seconds(store.read_round(0, 0).created_at)
    backend = gm.get_backend("torch")
    model = torch_gpt.GPT(config)
    windows = arms.validation(config)
    points = []
    for version in versions:
        stamp = _seconds(store.read_round(0, version).created_at) - origin
        params = store.load_version(spec, 0, version).params
        backend.write_parameters(model, {n: backend.from_numpy(a) for n, a in params.items()})
        points.append((stamp, version, torch_gpt.evaluate(model, windows)))
    return points


def run_arm(
    name: str, algorithm: gm.DiLoCo, steps: list[int], sleeps: list[float], config: GPTConfig, workdir: Path, seed: int = 0
) -> Timeline:
    arm = arms.gradientmail_arm(name, {}, "1:1:2:4", sleeps, steps, workdir, config=config, algorithm=algorithm, seed=seed)
    points = committed_timeline(workdir / "mailbox", config)
    return Timeline(name, steps, points[-1][0], arm.val_loss, arm.merged_share, points)


def plot(arms: list[Timeline], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for arm in arms:
        axes.plot([t for t, _, _ in arm.points], [loss for _, _, loss in arm.points], marker=".", label=arm.arm)
    axes.axhline(target, color="grey", linestyle=":", linewidth=1.0, label="lock-step DiLoCo's final loss")
    axes.set_xlabel("seconds since version 0")
    axes.set_ylabel("held-out loss of the committed model (nats)")
    axes.set_title("speeds 1:1:2:4, four learners")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def one_seed(
    seed: int, steps: int, sync_every: int, sleeps: list[float], config: GPTConfig, out: Path, cores: int
) -> dict[str, Any]:
    """Both arms and the in-process reference on data seed ``seed``; the ratio (None: never reached)."""
    slowest = max(SPEEDS)
    lock = run_arm(
        "lock-step DiLoCo (gm.DiLoCo.standard(nodes=4))",
        gm.DiLoCo.standard(nodes=len(SPEEDS), sync_every=sync_every),
        [steps] * len(SPEEDS),
        sleeps,
        config,
        out / "lockstep",
        seed,
    )
    print(f"  seed {seed}: {lock.arm}: final loss {lock.final_loss:.4f} in {lock.wall_s:.0f} s", flush=True)
    ours = run_arm(
        "GradientMail defaults",
        gm.DiLoCo(sync_every=sync_every, fragments=1),
        [round(steps * slowest / speed) for speed in SPEEDS],
        sleeps,
        config,
        out / "defaults",
        seed,
    )
    reached = ours.time_to(lock.final_loss)
    ratio = None if reached is None else reached / lock.wall_s
    print(
        f"  seed {seed}: {ours.arm}: final loss {ours.final_loss:.4f} in {ours.wall_s:.0f} s, merged {ours.merged_share:.3f}",
        flush=True,
    )
    torch.set_num_threads(cores)
    sync = arms.sync_diloco(config, steps, len(SPEEDS), sync_every, seed=seed)
    sync_reached = ours.time_to(sync.val_loss)
    print(f"  seed {seed}: synchronous DiLoCo in one process ({steps} steps each): {sync.val_loss:.4f}; the defaults reach it at "
          f"{'never' if sync_reached is None else f'{sync_reached:.0f} s'}")  # fmt: skip
    if ratio is None:
        print(f"  seed {seed}: GradientMail's committed model never reached {lock.final_loss:.4f} in {ours.wall_s:.0f} s")
    else:
        print(f"  seed {seed}: GradientMail reached lock-step DiLoCo's final loss {lock.final_loss:.4f} at {reached:.0f} s: "
              f"{ratio:.3f} × lock-step DiLoCo's {lock.wall_s:.0f} s")  # fmt: skip
    plot([lock, ours], lock.final_loss, out / "loss.png")
    return {
        "seed": seed,
        "arms": [asdict(lock), asdict(ours)],
        "time_to_target_s": reached,
        "ratio": ratio,
        "sync_diloco": {"val_loss": sync.val_loss, "defaults_reach_it_s": sync_reached},
    }


def main(runs_dir: Path, quick: bool = False, seeds: int | None = None) -> int:
    steps, sync_every = (QUICK_STEPS, QUICK_SYNC_EVERY) if quick else (STEPS, SYNC_EVERY)
    config = SHORT_STEP_MODEL if quick else DEFAULT_CONFIG
    count = seeds if seeds is not None else (1 if quick else MIN_RUNS)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    regime = Regime("straggler", len(SPEEDS), sync_every, steps, config, SPEEDS)
    sleeps = sleeps_for(regime, cores)
    out = runs_dir / f"straggler-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True)
    print(f"time to loss, speeds 1:1:2:4, {cores} cores, H = {sync_every}, {count} seeds; results in {out}", flush=True)
    runs = [one_seed(seed, steps, sync_every, sleeps, config, out / f"seed-{seed}", cores) for seed in range(count)]
    ratios = [math.inf if run["ratio"] is None else run["ratio"] for run in runs]
    judged = verdict(
        f"time to lock-step DiLoCo's final loss ÷ its wall time ≤ {TARGET_TIME_RATIO} (never reached counts as ∞)",
        ratios,
        at_most(TARGET_TIME_RATIO),
        judged_at=DEFAULTS,
    )
    print()
    print(f"  {judged.line('{:.3f}')}")
    result = {
        "machine": {"cores": cores, "torch": torch.__version__},
        "config": {"speeds": SPEEDS, "steps": steps, "sync_every": sync_every, "model": asdict(config), "sleeps_s": sleeps},
        "seeds": runs,
        "targets": [judged.as_json()],
    }
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {out / 'result.json'} and a loss.png per seed")
    return 0
