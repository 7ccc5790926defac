"""The arms the quality benchmarks train and compare (``benchmarks/quality.py``, ``regimes.py``,
``straggler.py``): the demo's GPT on Shakespeare, scored by the validation loss of the model
each ends with — data-parallel training, synchronous DiLoCo (the in-process lock-step loop),
one learner alone, and GradientMail's real learner processes on a directory or S3 mailbox.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gradientmail as gm
from demo import model as torch_gpt
from demo import settings
from demo.data import BatchSampler, load_corpus, validation_windows
from demo.model_config import DEFAULT_CONFIG, GPTConfig
from demo.reference import synchronous_diloco
from demo.trainer import build_trainer
from gradientmail.store import RunStore
from testing.processes import run_side_by_side
from testing.seaweed import S3Endpoint

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
