"""One learner of the demo run: ``python -m demo.worker --mailbox URL --learner-id ID ...``.

It trains the tiny GPT on its own seeded stream of Shakespeare inside a ``gm.Session``
and prints JSON-line events (see ``events.py``) on stdout; logs go to stderr. After the
``with`` block the model holds the newest committed parameters, whose validation loss is
the last event. ``--steps 0`` only joins and evaluates the committed model.

It is also ``gradientmail node``'s default job, named there by the import string
``demo.worker:node_main``: :func:`node_main` reads the node's ``GRADIENTMAIL_*`` settings.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from demo import events, settings
from demo.data import BatchSampler, CorpusMissing, load_corpus, validation_windows
from demo.device import DEVICE_VARIABLE, describe_device, resolve_device
from demo.model_config import DEFAULT_CONFIG, GPTConfig
from demo.trainer import Framework, Progress, build_trainer, run_steps
from gradientmail.errors import GradientMailError, InvalidConfig
from gradientmail.records import default_learner_id
from gradientmail.settings import NodeSettings

__all__ = ["WorkerConfig", "parse_args", "run", "main", "node_worker_config", "node_main"]

log = logging.getLogger("demo.worker")


@dataclass(frozen=True)
class WorkerConfig:
    mailbox: str
    learner_id: str
    steps: int
    seed: int
    framework: Framework = "torch"
    device: str = "cpu"
    """Where the PyTorch model trains: ``auto``, ``cpu``, ``mps``, ``cuda`` or ``cuda:N``
    (``demo.device.resolve_device``). The demo launcher's learners share the CPU; the node
    passes its ``GRADIENTMAIL_DEVICE`` (default ``auto``: CUDA when present)."""
    sync_every: int = settings.SYNC_EVERY
    fragments: int = settings.FRAGMENTS
    batch_size: int = settings.BATCH_SIZE
    lr: float = settings.LEARNING_RATE
    flush_on_close: bool = True
    eval_windows: int = settings.EVAL_WINDOWS
    report_every: int = settings.REPORT_EVERY
    stop_file: str | None = None
    """Stop early once this file exists (the launcher's signal to a slow learner)."""
    run_syncer: bool = True
    role: str = "both"
    """``SessionOptions.role``: ``both``, ``learner`` (as ``--no-syncer``) or ``either``."""
    niceness: int = 0
    """Lower this process's CPU priority by this much (the launcher's way to share few cores)."""
    outer_lr: float = settings.OUTER_LR
    outer_momentum: float = settings.OUTER_MOMENTUM
    quorum: int = 1
    merge: str = "rda"
    algorithm: Any = None
    """A whole ``gm.DiLoCo``: replaces the run knobs above (:func:`node_worker_config` passes the node's)."""
    options: Any = None
    """A whole ``gm.SessionOptions``: replaces ``run_syncer`` above."""
    step_sleep: float = 0.0
    """Seconds to sleep after each step: a slower learner (the quality benchmark's half-speed mix)."""
    keep_versions: int | None = None
    """Retention's ``keep_versions`` for a run this learner creates (None: the library's default);
    the quality benchmark keeps every version to account for every step afterwards."""
    retention: Any = None
    """A whole ``gm.Retention``: replaces ``keep_versions`` (the node passes its settings')."""
    model: GPTConfig = DEFAULT_CONFIG
    """The GPT's shape (the quality benchmark's short-step regimes train a smaller one)."""
    run_key: Any = None
    """A ``gm.RunKey`` (or its secret) to sign the run's records; None: ``GRADIENTMAIL_RUN_KEY``
    if set (the node passes its settings' key)."""


def parse_args(argv: Sequence[str] | None = None) -> WorkerConfig:
    parser = argparse.ArgumentParser(prog="python -m demo.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--mailbox", required=True, help="mailbox URL: file:///abs/path or s3://bucket/prefix")
    parser.add_argument("--learner-id", required=True)
    parser.add_argument("--steps", type=int, required=True, help="local steps to train (0: evaluate the committed model)")
    parser.add_argument("--seed", type=int, required=True, help="seed of this learner's batch stream")
    parser.add_argument("--framework", choices=["torch", "mlx"], default="torch")
    parser.add_argument(
        "--device", default="cpu", help="PyTorch device: auto (CUDA, else MPS, else CPU), cpu, mps, cuda or cuda:N"
    )
    parser.add_argument("--sync-every", type=int, default=settings.SYNC_EVERY, help="H, shared by the run")
    parser.add_argument("--fragments", type=int, default=settings.FRAGMENTS, help="P, shared by the run")
    parser.add_argument("--batch-size", type=int, default=settings.BATCH_SIZE)
    parser.add_argument("--lr", type=float, default=settings.LEARNING_RATE)
    parser.add_argument(
        "--no-flush",
        dest="flush_on_close",
        action="store_false",
        help="drop the steps since the last contribution on close instead of publishing them",
    )
    parser.add_argument("--eval-windows", type=int, default=settings.EVAL_WINDOWS)
    parser.add_argument("--report-every", type=int, default=settings.REPORT_EVERY)
    parser.add_argument("--stop-file", help="stop training early once this file exists")
    parser.add_argument("--no-syncer", dest="run_syncer", action="store_false", help="never act as the run's syncer")
    parser.add_argument(
        "--role", choices=["both", "learner", "either"], default="both", help="this node's role (docs/session.md)"
    )
    parser.add_argument("--niceness", type=int, default=0, help="lower this process's CPU priority by this much")
    parser.add_argument(
        "--outer-lr", type=float, default=settings.OUTER_LR, help="Nesterov outer learning rate, shared by the run"
    )
    parser.add_argument(
        "--outer-momentum", type=float, default=settings.OUTER_MOMENTUM, help="Nesterov outer momentum, shared by the run"
    )
    parser.add_argument("--quorum", type=int, default=1, help="K, contributions a round waits for; shared by the run")
    parser.add_argument("--merge", choices=["rda", "mean"], default="rda", help="how rounds merge deltas; shared by the run")
    parser.add_argument(
        "--algorithm",
        dest="algorithm_json",
        metavar="JSON",
        help="a whole gm.DiLoCo in its manifest form (JSON); replaces the run knobs above",
    )
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step (a slower learner)")
    parser.add_argument("--keep-versions", type=int, default=None, help="retention of a run this learner creates")
    parser.add_argument(
        "--model",
        dest="model_json",
        metavar="JSON",
        help='the GPT\'s shape as GPTConfig fields, e.g. {"width": 64, "layers": 2}; every learner of a run the same',
    )
    args = parser.parse_args(argv)
    if args.steps < 0:
        parser.error("--steps must be non-negative")
    if args.step_sleep < 0:
        parser.error("--step-sleep must be non-negative")
    knobs = vars(args)
    model_json = knobs.pop("model_json")
    if model_json is not None:
        try:
            knobs["model"] = GPTConfig(**json.loads(model_json))
        except (TypeError, ValueError) as exc:
            parser.error(f"--model: {exc}")
    algorithm_json = knobs.pop("algorithm_json")
    if algorithm_json is not None:
        import gradientmail as gm

        knobs["algorithm"] = gm.DiLoCo.from_manifest(json.loads(algorithm_json))
    return WorkerConfig(**knobs)


def run(config: WorkerConfig) -> float:
    """Train inside a session; print events; return the committed model's validation loss.

    Raises whatever ``gm.Session`` raises on joining (``RunConfigMismatch``, ``MailboxError``),
    ``CorpusMissing`` without the text and ``InvalidConfig`` (field ``device``) for a device
    this machine cannot use.
    """
    import gradientmail as gm

    device = _trainer_device(config)
    if config.niceness > 0 and hasattr(os, "nice"):
        os.nice(config.niceness)
    if config.framework == "torch":
        import torch

        torch.set_num_threads(1)  # several learners share the machine's cores
    model_config = config.model
    corpus = load_corpus()
    validation = validation_windows(corpus.validation, config.eval_windows, model_config.context)
    sampler = BatchSampler(corpus.train, config.batch_size, model_config.context, seed=config.seed)
    trainer = build_trainer(config.framework, model_config, config.lr, device=device)
    learner = config.learner_id
    if device != "cpu":
        log.info("%s trains on %s", config.learner_id, describe_device(device))
    events.emit(
        "start",
        learner,
        framework=config.framework,
        device=trainer.device,
        steps=config.steps,
        batch_size=config.batch_size,
        tokens_per_step=sampler.tokens_per_batch,
    )

    algorithm = config.algorithm or gm.DiLoCo(
        sync_every=config.sync_every,
        fragments=config.fragments,
        flush_on_close=config.flush_on_close,
        outer_lr=config.outer_lr,
        outer_momentum=config.outer_momentum,
        quorum_size=config.quorum,
        merge=gm.Rda() if config.merge == "rda" else gm.WeightedMean(),
    )
    options = config.options or gm.SessionOptions(run_syncer=config.run_syncer, role=config.role)
    stop_file = config.stop_file
    local_val_loss: float | None = None
    retention = config.retention
    if retention is None and config.keep_versions is not None:
        retention = gm.Retention(keep_versions=config.keep_versions, audit_rounds=min(8, config.keep_versions - 1))
    with gm.Session(
        trainer.model,
        algorithm=algorithm,
        mailbox=config.mailbox,
        learner_id=learner,
        options=options,
        retention=retention,
        run_key=config.run_key or gm.RunKey.from_env(),
    ) as session:

        def report(progress: Progress) -> None:
            events.emit(
                "progress",
                learner,
                step=progress.step,
                steps=config.steps,
                loss=progress.loss,
                tokens=progress.tokens,
                elapsed_s=round(progress.elapsed_s, 3),
                steps_per_s=round(progress.step / max(progress.elapsed_s, 1e-9), 3),
                versions=dict(session.versions),
            )

        last = run_steps(
            trainer,
            sampler,
            config.steps,
            report,
            session=session,
            report_every=config.report_every,
            should_stop=lambda: stop_file is not None and os.path.exists(stop_file),
            step_sleep_s=config.step_sleep,
        )
        if last.step:
            local_val_loss = trainer.evaluate(validation)
    # the session has closed: the model now holds the newest committed parameters
    val_loss = trainer.evaluate(validation)
    stats = session.stats
    events.emit(
        "final",
        learner,
        steps=last.step,
        tokens=last.tokens,
        elapsed_s=round(last.elapsed_s, 3),
        local_val_loss=local_val_loss,
        val_loss=val_loss,
        versions=dict(session.versions),
        contributions=stats.contributions,
        alignments=stats.alignments,
        bytes_published=session.bytes_published,
        bytes_fetched=session.bytes_fetched,
        dropped_at_close=list(stats.dropped_at_close),
    )
    return val_loss


def _trainer_device(config: WorkerConfig) -> str:
    """The resolved PyTorch device, or ``"mlx"`` (MLX's default device) for an MLX learner."""
    if config.framework == "torch":
        return resolve_device(config.device)
    if config.device.startswith("cuda"):
        raise InvalidConfig("device", f"{DEVICE_VARIABLE}={config.device!r} applies to PyTorch; the MLX trainer has no CUDA")
    return "mlx"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one learner; a configuration or mailbox problem ends with one clear line and exit 2."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = parse_args(argv)
    try:
        run(config)
    except (GradientMailError, CorpusMissing) as exc:
        print(f"{config.learner_id}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


def node_worker_config(node: NodeSettings) -> WorkerConfig:
    """The worker a ``gradientmail node`` runs by default, under that node's settings.

    The batch stream's seed comes from the learner id, so every node of a run sees different
    data and a restarted node the same as before. Every algorithm and session setting is
    passed on whole; ``steps`` defaults to the demo's; ``device`` is the node's
    ``GRADIENTMAIL_DEVICE`` (default ``auto``: CUDA when present, else MPS, else CPU).

    Raises:
        InvalidConfig: the ``numpy`` backend (this worker trains a torch or MLX model).
    """
    if node.backend == "numpy":
        raise InvalidConfig("backend", "the default job (demo.worker) trains with 'torch' or 'mlx', not 'numpy'")
    learner_id = node.learner_id or default_learner_id()
    return WorkerConfig(
        mailbox=node.mailbox,
        learner_id=learner_id,
        steps=settings.STEPS if node.steps is None else node.steps,
        seed=zlib.crc32(learner_id.encode()) % 2**31,
        framework=node.backend or "torch",
        device=node.device,
        algorithm=node.algorithm(),
        options=node.session_options(),
        retention=node.retention(),
        run_key=node.key(),
    )


def node_main() -> int:
    """``gradientmail node``'s default job: one learner configured only by ``GRADIENTMAIL_*``.

    Called by the node (``demo.worker:node_main``) after it has set up logging, telemetry and
    SIGTERM handling; the node turns ``InvalidConfig`` into exit 2 and other errors into exit 1.
    """
    config = node_worker_config(NodeSettings.from_env())
    log.info(
        "running the demo worker: %s on device %s, %d steps, learner %s",
        config.framework,
        config.device,
        config.steps,
        config.learner_id,
    )
    run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
