"""A learner whose training shows in TensorBoard: loss, learning rate and samples per second
through ``session.report`` and a listener that writes them (``gradientmail/session/events.py``).

    python examples/tensorboard_learner.py --mailbox file:///tmp/tb-run --logdir /tmp/tb
    tensorboard --logdir /tmp/tb          # offline: every learner writes its own run directory

The listener is the whole integration: every ``reported`` event becomes scalars at the run's
step count (``total_steps``, which continues across resumed restarts), and every alignment a
``gradientmail/aligned_version`` point, so a commit's effect on the loss is visible. Any tracker
with a ``log(name, value, step)`` call fits the same place (MLflow's ``mlflow.log_metrics``,
W&B's ``wandb.log``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter

import gradientmail as gm


def tensorboard_listener(writer: SummaryWriter) -> Callable[[gm.SessionEvent], None]:
    """A session listener that writes reported scalars and alignments to ``writer``."""

    def listen(event: gm.SessionEvent) -> None:
        if event.kind == "reported":
            for name, value in event.scalars.items():
                writer.add_scalar(name, value, event.total_steps)
        elif event.kind == "aligned":
            writer.add_scalar(f"gradientmail/aligned_version/fragment_{event.fragment}", event.version, event.total_steps)

    return listen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mailbox", required=True)
    parser.add_argument("--learner-id", default="tb-0")
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    truth = torch.randn(16, 1)
    writer = SummaryWriter(str(Path(args.logdir) / args.learner_id))
    session = gm.Session(model, algorithm=gm.DiLoCo(sync_every=20, fragments=2), mailbox=args.mailbox, learner_id=args.learner_id)
    session.add_listener(tensorboard_listener(writer))
    started = time.perf_counter()
    with session:
        for _ in range(args.steps):
            x = torch.randn(32, 16)
            loss = torch.nn.functional.mse_loss(model(x), x @ truth)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            session.step(samples=len(x))
            elapsed = time.perf_counter() - started
            session.report(loss=loss.item(), lr=schedule.get_last_lr()[0], samples_per_s=session.stats.samples / elapsed)
    writer.close()
    print(f"{args.learner_id}: {session.stats.steps} steps, versions {dict(session.versions)}, scalars in {args.logdir}")


if __name__ == "__main__":
    main()
