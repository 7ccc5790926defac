"""Synchronous DiLoCo in one process: the reference an asynchronous run is measured against.

M replicas of the demo's GPT train in lock-step: each round every replica starts from the
global parameters, trains H steps with its own AdamW (its state kept across rounds, as in
DiLoCo) on its own seeded batch stream, the global parameters take the library's Nesterov
outer step on the *mean* pseudo-gradient (global − replica). Nothing is asynchronous,
nothing is dropped: the algorithm the papers measure, in a few lines, with no mailbox.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from demo import model as torch_gpt
from demo.data import BatchSampler
from demo.model_config import GPTConfig
from gradientmail.algorithms import NesterovOuter, OuterState, weighted_mean
from gradientmail.backends import get_backend

__all__ = ["REFERENCE_ID", "SyncDiLoCoResult", "main", "synchronous_diloco"]

REFERENCE_ID = "sync-diloco"


@dataclass(frozen=True)
class SyncDiLoCoResult:
    model: torch_gpt.GPT
    """The global model after the last outer step."""
    losses: list[float]
    """Mean training loss over the replicas at each local step."""
    rounds: int


def synchronous_diloco(
    config: GPTConfig,
    tokens: np.ndarray,
    *,
    seeds: Sequence[int],
    steps: int,
    sync_every: int,
    batch_size: int,
    lr: float,
    outer: NesterovOuter,
    init_seed: int = 0,
    on_step: Callable[[int], None] | None = None,
) -> SyncDiLoCoResult:
    """Train ``len(seeds)`` replicas for ``steps`` local steps each, synchronising every ``sync_every``."""
    backend = get_backend("torch")
    global_model = torch_gpt.GPT(config, seed=init_seed)
    names = [name for name, _ in global_model.named_parameters()]
    global_params = backend.read_parameters(global_model, names)
    state = OuterState.zeros(backend, global_params)
    replicas = [torch_gpt.GPT(config, seed=init_seed) for _ in seeds]
    optimizers = [torch_gpt.make_optimizer(replica, lr) for replica in replicas]
    samplers = [BatchSampler(tokens, batch_size, config.context, seed=seed) for seed in seeds]
    losses: list[float] = []
    done = rounds = 0
    while done < steps:
        length = min(sync_every, steps - done)
        for replica in replicas:
            backend.write_parameters(replica, global_params)
        round_losses = np.zeros(length)
        for replica, optimizer, sampler in zip(replicas, optimizers, samplers, strict=True):
            for step in range(length):
                round_losses[step] += torch_gpt.train_step(replica, optimizer, sampler.next()) / len(replicas)
        for step in range(length):
            losses.append(float(round_losses[step]))
            if on_step is not None:
                on_step(done + step + 1)
        deltas = [
            {n: backend.sub(global_params[n], local) for n, local in backend.read_parameters(replica, names).items()}
            for replica in replicas
        ]
        mean = {n: weighted_mean([d[n] for d in deltas], [1.0] * len(deltas), backend) for n in names}
        global_params, state = outer.step(backend, global_params, state, mean)
        done += length
        rounds += 1
    backend.write_parameters(global_model, global_params)
    return SyncDiLoCoResult(global_model, losses, rounds)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m demo.reference``: the main job's synchronous-DiLoCo row, as JSON-line events."""
    import argparse

    from demo import events, settings
    from demo.data import load_corpus, validation_windows

    parser = argparse.ArgumentParser(prog="python -m demo.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=settings.LEARNERS)
    parser.add_argument("--steps", type=int, default=settings.STEPS)
    parser.add_argument("--sync-every", type=int, default=settings.SYNC_EVERY)
    parser.add_argument("--batch-size", type=int, default=settings.BATCH_SIZE)
    parser.add_argument("--outer-lr", type=float, default=settings.OUTER_LR)
    parser.add_argument("--outer-momentum", type=float, default=settings.OUTER_MOMENTUM)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = GPTConfig()
    corpus = load_corpus()
    events.emit("start", REFERENCE_ID, framework="torch", steps=args.steps, batch_size=args.batch_size, replicas=args.replicas)

    def progress(step: int) -> None:
        if step % settings.REPORT_EVERY == 0 or step == args.steps:
            events.emit("progress", REFERENCE_ID, step=step, steps=args.steps)

    result = synchronous_diloco(
        config, corpus.train, seeds=range(1, args.replicas + 1), steps=args.steps, sync_every=args.sync_every,
        batch_size=args.batch_size, lr=settings.LEARNING_RATE,
        outer=NesterovOuter(lr=args.outer_lr, momentum=args.outer_momentum), on_step=progress,
    )  # fmt: skip
    loss = torch_gpt.evaluate(result.model, validation_windows(corpus.validation, settings.EVAL_WINDOWS, config.context))
    events.emit("final", REFERENCE_ID, steps=args.steps, rounds=result.rounds, val_loss=loss)


if __name__ == "__main__":
    main()
