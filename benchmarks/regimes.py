"""The regime matrix: does the default run train as well as synchronous DiLoCo in every regime?

    python -m benchmarks.quality --regimes                      # every regime, ~25 minutes on 2 cores
    python -m benchmarks.quality --regimes --only short         # the regimes whose names contain "short"
    python -m benchmarks.quality --regimes --knobs '{"quorum_size": 2}'   # another setting, same matrix
    python -m benchmarks.quality --regimes --knobs '[{}, {"grace_rule": "live"}]'   # several, shared references
    python -m benchmarks.quality --regimes --quick              # a smoke run: two short regimes, 60 steps

A default that ties synchronous DiLoCo in one regime can lose to one learner alone in another
(steps much shorter than a mailbox round trip, more learners, uneven speeds, a store with real
latency). Each regime runs GradientMail's defaults (``gm.DiLoCo(sync_every=H, fragments=1)``,
plus ``--knobs``) as real learner processes, and beside it, in the same run, on the same samples:
synchronous DiLoCo at the same M, H and steps (in-process lock-step, ``demo/reference.py``) and
one learner alone at the same number of steps. Each is printed as a ratio with its verdict.

Speeds are set by a sleep per step (``(speed − 1)`` × the measured step time under the
regime's contention), so a slow learner costs no CPU. Regimes that share M, H, steps and model
share their references. Writes ``runs/regimes-<time>/result.json`` and ``loss.png``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from benchmarks import arms
from benchmarks.targets import DEFAULTS, MIN_RUNS, Verdict, at_least, at_most, verdict
from demo.model_config import DEFAULT_CONFIG, GPTConfig
from testing.seaweed import Seaweed

SHORT_STEP_MODEL = GPTConfig(context=64, layers=2, width=64, heads=4)
"""A smaller GPT whose steps take ~10–15 ms on one thread here: a step short next to a mailbox
round trip (the common case of a small model on a fast device)."""

TARGET_RATIO = 1.01
TARGET_MERGED_SHARE = 0.97


@dataclass(frozen=True)
class Regime:
    name: str
    learners: int
    sync_every: int
    steps: int
    model: GPTConfig
    speeds: tuple[float, ...]
    """Each learner's slowdown: 1 is full speed, 4 a learner four times slower."""
    store: str = "directory"
    """``directory`` or ``s3`` (a loopback SeaweedFS server, started for the run)."""

    @property
    def reference_key(self) -> tuple[int, int, int, GPTConfig]:
        return (self.learners, self.sync_every, self.steps, self.model)


REGIMES: tuple[Regime, ...] = (
    Regime("short steps, M = 2, H = 20", 2, 20, 400, SHORT_STEP_MODEL, (1, 1)),
    Regime("short steps, M = 4, H = 20", 4, 20, 400, SHORT_STEP_MODEL, (1, 1, 1, 1)),
    Regime("short steps on S3, M = 4, H = 20", 4, 20, 400, SHORT_STEP_MODEL, (1, 1, 1, 1), store="s3"),
    Regime("medium, M = 4, H = 50", 4, 50, 300, DEFAULT_CONFIG, (1, 1, 1, 1)),
    Regime("uneven 1:1:2:4, M = 4, H = 50", 4, 50, 300, DEFAULT_CONFIG, (1, 1, 2, 4)),
    Regime("medium, M = 8, H = 50", 8, 50, 300, DEFAULT_CONFIG, (1,) * 8),
)


@dataclass
class RegimeResult:
    regime: str
    arm: arms.Arm
    sync: arms.Arm
    alone: arms.Arm
    seed: int = 0

    @property
    def ratio(self) -> float:
        return self.arm.val_loss / self.sync.val_loss


def regime_verdicts(results: Sequence[RegimeResult], setting: str) -> list[Verdict]:
    """Each regime's three targets on the median over its data seeds of the per-seed figure
    (the arm against the references of its own seed)."""
    verdicts = []
    for name in dict.fromkeys(r.regime for r in results):
        runs = [r for r in results if r.regime == name]
        verdicts += [
            verdict(
                f"{name}: loss ÷ sync DiLoCo ≤ {TARGET_RATIO}", [r.ratio for r in runs], at_most(TARGET_RATIO), setting=setting
            ),
            verdict(
                f"{name}: merged share of learner steps ≥ {TARGET_MERGED_SHARE}",
                [r.arm.merged_share for r in runs],
                at_least(TARGET_MERGED_SHARE),
                setting=setting,
            ),
            verdict(
                f"{name}: loss ÷ one learner alone ≤ 1",
                [r.arm.val_loss / r.alone.val_loss for r in runs],
                at_most(1.0),
                setting=setting,
            ),
        ]
    return verdicts


def sleeps_for(regime: Regime, cores: int) -> list[float]:
    """Seconds each learner sleeps after a step so that its speed is ``1 / speed`` of a full-speed
    learner's under this regime's contention (learners share the cores)."""
    step_s = arms.step_time_s(regime.model) * max(1.0, regime.learners / cores)
    torch.set_num_threads(cores)
    return [(speed - 1.0) * step_s for speed in regime.speeds]


References = dict[tuple[int, int, int, GPTConfig, int], tuple[arms.Arm, arms.Arm]]
"""Synchronous DiLoCo and one learner alone per (learners, steps, H, model, data seed)."""


def run_matrix(
    regimes: Sequence[Regime], knobs: dict[str, Any], out: Path, references: References | None = None, seeds: int = 1
) -> list[RegimeResult]:
    """Every regime's arm and references on each of ``seeds`` data seeds, printed as they finish
    (``references`` computed once per seed for several settings: pass the same dict)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    references = {} if references is None else references
    results: list[RegimeResult] = []
    server: Seaweed | None = None
    scratch = tempfile.TemporaryDirectory(prefix="gm-regimes-s3-")
    try:
        for index, (regime, seed) in enumerate((r, s) for s in range(seeds) for r in regimes):
            sleeps = sleeps_for(regime, cores)
            key = (*regime.reference_key, seed)
            if key not in references:
                torch.set_num_threads(cores)
                sync = arms.sync_diloco(regime.model, regime.steps, regime.learners, regime.sync_every, seed=seed)
                alone = arms.single_learner(regime.model, regime.steps, seed=seed)
                references[key] = (sync, alone)
                print(f"  seed {seed}: references M = {regime.learners}, H = {regime.sync_every}: sync DiLoCo "
                      f"{sync.val_loss:.4f}, one learner alone {alone.val_loss:.4f}", flush=True)  # fmt: skip
            sync, alone = references[key]
            s3 = None
            if regime.store == "s3":
                if server is None:
                    server = Seaweed.start(Path(scratch.name), bucket="gradientmail-regimes")
                s3 = server.server
            arm = arms.gradientmail_arm(
                "GradientMail defaults" if not knobs else f"GradientMail {json.dumps(knobs)}",
                knobs,
                regime.name,
                sleeps,
                regime.steps,
                out / f"regime-{index}-{len(list(out.glob('regime-*')))}",
                sync_every=regime.sync_every,
                config=regime.model,
                s3=s3,
                seed=seed,
            )
            result = RegimeResult(regime.name, arm, sync, alone, seed)
            results.append(result)
            print(f"  seed {seed}: {regime.name}: {arm.val_loss:.4f} ({result.ratio:.4f} × sync), merged {arm.merged_share:.3f}, "
                  f"{arm.stale} stale, {arm.wall_s:.0f} s", flush=True)  # fmt: skip
    finally:
        if server is not None:
            server.stop()
        scratch.cleanup()
    return results


def table(results: Sequence[RegimeResult]) -> list[str]:
    lines = [
        f"{'regime':<34} {'val loss':>8} {'sync':>7} {'÷ sync':>7} {'alone':>7} {'÷ alone':>7} {'merged':>7} "
        f"{'stale':>5} {'per rnd':>7} {'grace s':>7} {'spread s':>8} {'wall s':>6}"
    ]
    for r in results:
        lines.append(
            f"{r.regime:<34} {r.arm.val_loss:8.4f} {r.sync.val_loss:7.4f} {r.ratio:7.4f} {r.alone.val_loss:7.4f} "
            f"{r.arm.val_loss / r.alone.val_loss:7.4f} {r.arm.merged_share:7.3f} {r.arm.stale:5d} "
            f"{r.arm.participants_per_round:7.2f} {r.arm.grace_s:7.2f} {r.arm.arrival_spread_s:8.2f} {r.arm.wall_s:6.0f}"
        )
    return lines


def plot(results: Sequence[RegimeResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5))
    for index, r in enumerate(results):
        colour = plt.get_cmap("tab10")(index)
        steps, losses = zip(*r.arm.curve, strict=True) if r.arm.curve else ((), ())
        axes.plot(steps, losses, color=colour, label=f"{r.regime}: GradientMail")
        steps, losses = zip(*r.sync.curve, strict=True) if r.sync.curve else ((), ())
        axes.plot(steps, losses, color=colour, linestyle=":", linewidth=1.0)
    axes.set_xlabel("local step")
    axes.set_ylabel("training loss (nats; dotted: synchronous DiLoCo at the same M, H)")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


QUICK_STEPS = 60


def main(
    only: Sequence[str] | None,
    knobs: dict[str, Any] | list[dict[str, Any]],
    runs_dir: Path,
    quick: bool = False,
    seeds: int | None = None,
) -> int:
    """Run the matrix (``quick``: a smoke run, the short-step regimes at M = 2 and on S3, 60 steps,
    one seed); ``knobs`` a list: one matrix per setting, sharing the references; ``seeds`` data
    seeds per regime (default 3): each target on the median of its per-seed figures."""
    seeds = (1 if quick else MIN_RUNS) if seeds is None else seeds
    regimes = [r for r in REGIMES if not only or any(word in r.name for word in only)]
    if quick:
        regimes = [replace(r, steps=QUICK_STEPS) for r in regimes if r.model == SHORT_STEP_MODEL and r.sync_every == 20]
        regimes = [r for r in regimes if r.learners == 2 or r.store == "s3"]
    if not regimes:
        print(f"no regime matches {list(only or [])}; regimes: {[r.name for r in REGIMES]}")
        return 2
    settings = knobs if isinstance(knobs, list) else [knobs]
    out = runs_dir / f"regimes-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True)
    print(f"regime matrix: {len(regimes)} regimes × {len(settings)} settings; results in {out}", flush=True)
    references: References = {}
    matrices = []
    for setting in settings:
        print(f"setting: {json.dumps(setting) if setting else 'defaults'}", flush=True)
        matrices.append((setting, run_matrix(regimes, setting, out, references, seeds)))
    entries = []
    all_verdicts = []
    for setting, results in matrices:
        print(f"\n{json.dumps(setting) if setting else 'defaults'}")
        for line in table(results):
            print(line)
        named = json.dumps(setting) if setting else DEFAULTS
        verdicts = regime_verdicts(results, named)
        print()
        for v in verdicts:
            print(f"  {v.line()}")
        all_verdicts.extend((setting, v) for v in verdicts)
        entries.extend(
            {
                "knobs": setting,
                "seed": r.seed,
                "regime": asdict(next(g for g in regimes if g.name == r.regime)),
                "arm": asdict(r.arm),
                "sync": asdict(r.sync),
                "alone": asdict(r.alone),
            }
            for r in results
        )
    plot([r for r in matrices[0][1] if r.seed == 0], out / "loss.png")
    result = {
        "machine": {"cores": os.cpu_count(), "torch": torch.__version__},
        "settings": settings,
        "regimes": entries,
        "targets": [{"knobs": setting, **v.as_json()} for setting, v in all_verdicts],
    }
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {out / 'result.json'} and {out / 'loss.png'}")
    return 0
