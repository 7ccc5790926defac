"""A learner whose training shows in MLflow: loss, learning rate and samples per second
through ``session.report`` and a listener that logs them (``gradientmail/session/events.py``).

    python examples/mlflow_learner.py --mailbox file:///tmp/mlflow-run --tracking-uri sqlite:////tmp/mlflow.db
    mlflow ui --backend-store-uri sqlite:////tmp/mlflow.db   # offline; the UI needs the full `mlflow`

The listener is the whole integration, as in ``examples/tensorboard_learner.py``: every
``reported`` event becomes metrics at the run's step count (``total_steps``, which continues
across resumed restarts), and every alignment a ``gradientmail/aligned_version`` point, so a
commit's effect on the loss is visible. Every learner is its own MLflow run (named by its
learner id) in one experiment, with the exchange's settings as the run's params. The tracking
store is a local SQLite file, no server: MLflow 3 refuses its old ``./mlruns`` file store.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch

import gradientmail as gm

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # offline: MLflow 3 sends usage data unless told not to
import mlflow  # after it: the setting is read at import


def mlflow_listener(run_id: str) -> Callable[[gm.SessionEvent], None]:
    """A session listener that logs reported scalars and alignments to the MLflow run ``run_id``."""

    def listen(event: gm.SessionEvent) -> None:
        if event.kind == "reported":
            mlflow.log_metrics(dict(event.scalars), step=event.total_steps, run_id=run_id)
        elif event.kind == "aligned":
            name = f"gradientmail/aligned_version/fragment_{event.fragment}"
            mlflow.log_metric(name, event.version, step=event.total_steps, run_id=run_id)

    return listen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mailbox", required=True)
    parser.add_argument("--learner-id", default="mlflow-0")
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db", help="default: mlflow.db here, as `mlflow ui` reads")
    parser.add_argument("--experiment", default="gradientmail")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    truth = torch.randn(16, 1)
    algorithm = gm.DiLoCo(sync_every=20, fragments=2)
    session = gm.Session(model, algorithm=algorithm, mailbox=args.mailbox, learner_id=args.learner_id)
    mlflow.set_tracking_uri(args.tracking_uri)
    mlflow.set_experiment(args.experiment)
    with mlflow.start_run(run_name=args.learner_id) as run:  # marked FAILED if training raises
        mlflow.log_params({"learner_id": args.learner_id, "sync_every": algorithm.sync_every, "fragments": algorithm.fragments})
        session.add_listener(mlflow_listener(run.info.run_id))
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
    print(f"{args.learner_id}: {session.stats.steps} steps, versions {dict(session.versions)}, metrics in {args.tracking_uri}")


if __name__ == "__main__":
    main()
