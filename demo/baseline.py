"""The comparison: one learner, no GradientMail, trained on as many tokens as all learners together.

``python -m demo.baseline --steps N --batch-size B`` runs the same model,
optimizer and loop as the workers, without a session. The launcher gives it the learners'
steps and ``learners × batch`` windows per step: the same tokens and the same number of
optimizer steps as the run, i.e. what synchronous data-parallel training would do.
Prints the same JSON-line events as a worker, with ``initial_val_loss`` in ``start``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from demo import events, settings
from demo.data import BatchSampler, load_corpus, validation_windows
from demo.model_config import GPTConfig
from demo.trainer import Framework, Progress, build_trainer, run_steps

__all__ = ["run", "main"]

BASELINE_ID = "baseline"


def run(
    steps: int,
    batch_size: int,
    *,
    seed: int = 1000,
    framework: Framework = "torch",
    lr: float = settings.LEARNING_RATE,
    eval_windows: int = settings.EVAL_WINDOWS,
    report_every: int = settings.REPORT_EVERY,
    threads: int = 1,
) -> tuple[float, float]:
    """Train; print events; return (initial, final) validation loss."""
    if framework == "torch":
        import torch

        torch.set_num_threads(threads)
    model_config = GPTConfig()
    corpus = load_corpus()
    validation = validation_windows(corpus.validation, eval_windows, model_config.context)
    sampler = BatchSampler(corpus.train, batch_size, model_config.context, seed=seed)
    trainer = build_trainer(framework, model_config, lr)
    initial = trainer.evaluate(validation)
    events.emit(
        "start",
        BASELINE_ID,
        framework=framework,
        steps=steps,
        batch_size=batch_size,
        tokens_per_step=sampler.tokens_per_batch,
        initial_val_loss=initial,
    )

    def report(progress: Progress) -> None:
        events.emit(
            "progress",
            BASELINE_ID,
            step=progress.step,
            steps=steps,
            loss=progress.loss,
            tokens=progress.tokens,
            elapsed_s=round(progress.elapsed_s, 3),
            steps_per_s=round(progress.step / max(progress.elapsed_s, 1e-9), 3),
        )

    last = run_steps(trainer, sampler, steps, report, report_every=report_every)
    final = trainer.evaluate(validation)
    events.emit("final", BASELINE_ID, steps=last.step, tokens=last.tokens, elapsed_s=round(last.elapsed_s, 3), val_loss=final)
    return initial, final


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo.baseline", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=settings.STEPS)
    parser.add_argument("--batch-size", type=int, default=settings.LEARNERS * settings.BATCH_SIZE)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--framework", choices=["torch", "mlx"], default="torch")
    parser.add_argument("--lr", type=float, default=settings.LEARNING_RATE)
    parser.add_argument("--eval-windows", type=int, default=settings.EVAL_WINDOWS)
    parser.add_argument("--report-every", type=int, default=settings.REPORT_EVERY)
    parser.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads")
    parser.add_argument("--quick", action="store_true", help=f"{settings.QUICK_STEPS} steps, for tests")
    args = parser.parse_args(argv)
    run(
        settings.QUICK_STEPS if args.quick else args.steps,
        args.batch_size,
        seed=args.seed,
        framework=args.framework,
        lr=args.lr,
        eval_windows=args.eval_windows,
        report_every=args.report_every,
        threads=args.threads,
    )


if __name__ == "__main__":
    main()
