"""One face over the PyTorch and MLX twins, and the training loop every demo process runs.

The worker (inside a ``gm.Session``) and the baseline (without one) share this loop, so the
only difference between them is the exchange.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from demo.data import BatchSampler
from demo.model_config import GPTConfig

__all__ = ["Framework", "Trainer", "build_trainer", "Progress", "run_steps"]

Framework = Literal["torch", "mlx"]
Batch = tuple[np.ndarray, np.ndarray]


@dataclass
class Trainer:
    """A model, its AdamW optimizer and the framework's step and evaluation functions."""

    framework: Framework
    model: Any
    """``torch.nn.Module`` or ``mlx.nn.Module``: what ``gm.Session`` exchanges."""
    device: str
    """Where the PyTorch model lives (``cpu``, ``cuda``, ``cuda:N``, ``mps``), NumPy batches
    moving there in each step and evaluation; ``"mlx"``: MLX's own default device."""
    step: Callable[[Batch], float]
    """One optimizer update; returns the batch's loss before it."""
    evaluate: Callable[[Batch], float]
    """Mean loss over validation windows."""


def build_trainer(framework: Framework, config: GPTConfig, lr: float, init_seed: int = 0, device: str = "cpu") -> Trainer:
    """The tiny GPT in ``framework``, initialised from ``init_seed`` (same bytes in both).

    ``device`` is a torch device string (resolve ``GRADIENTMAIL_DEVICE`` with
    ``demo.device.resolve_device`` first): the PyTorch model and its optimizer state live
    there. MLX ignores it: its model lives on MLX's default device (the Mac's GPU).
    """
    if framework == "torch":
        from demo import model as torch_gpt

        model = torch_gpt.GPT(config, seed=init_seed).to(device)  # the same seeded weights on every device
        optimizer = torch_gpt.make_optimizer(model, lr)  # after the move: its state is created next to the parameters
        return Trainer(
            "torch",
            model,
            device,
            lambda batch: torch_gpt.train_step(model, optimizer, batch),
            lambda data: torch_gpt.evaluate(model, data),
        )
    if framework == "mlx":
        from demo import model_mlx as mlx_gpt

        model = mlx_gpt.GPT(config, seed=init_seed)
        optimizer = mlx_gpt.make_optimizer(model, lr)
        return Trainer(
            "mlx",
            model,
            "mlx",
            lambda batch: mlx_gpt.train_step(model, optimizer, batch),
            lambda data: mlx_gpt.evaluate(model, data),
        )
    raise ValueError(f"unknown framework {framework!r}: use 'torch' or 'mlx'")


class SupportsStep(Protocol):
    def step(self, samples: int = 1) -> None: ...


@dataclass(frozen=True)
class Progress:
    """What the loop reports every ``report_every`` steps (and after the last one)."""

    step: int
    loss: float
    """Mean training loss over the steps since the previous report."""
    tokens: int
    elapsed_s: float


def run_steps(
    trainer: Trainer,
    sampler: BatchSampler,
    steps: int,
    report: Callable[[Progress], None],
    *,
    session: SupportsStep | None = None,
    report_every: int = 10,
    should_stop: Callable[[], bool] = lambda: False,
    step_sleep_s: float = 0.0,
) -> Progress:
    """Train ``steps`` steps (fewer if ``should_stop()`` turns true); return the last report.

    With a ``session``, each step is counted there with its token count as ``samples``.
    """
    started = time.perf_counter()
    losses: list[float] = []
    done = 0
    last = Progress(0, float("nan"), 0, 0.0)
    for done in range(1, steps + 1):
        losses.append(trainer.step(sampler.next()))
        if session is not None:
            session.step(samples=sampler.tokens_per_batch)
        if step_sleep_s:
            time.sleep(step_sleep_s)  # a slower machine, for the benchmark's mixed-speed runs
        stopping = should_stop()
        if done % report_every == 0 or done == steps or stopping:
            last = Progress(done, float(np.mean(losses)), done * sampler.tokens_per_batch, time.perf_counter() - started)
            report(last)
            losses.clear()
        if stopping:
            break
    return last
