"""What a learner's resume costs: saving its state (``state_dir``) against its training steps.

    python -m benchmarks.learner_state                  # the demo GPT at 4× width (~10M parameters)
    python -m benchmarks.learner_state --width 128      # the demo's default size

The demo GPT with Adam after a few steps (its moments filled), its state saved the way
``gm.Session`` saves it (``session/resume.py``: the optimizer's ``state_dict``, the step count,
the random generators) to a local directory, to a directory mailbox and to a loopback SeaweedFS
S3 server (``state_dir="mailbox"``), and loaded back. Each save's seconds are printed next to
the reference in the same run, one training step of the same model, as steps per save: at
``save_state_every`` steps between saves, the training thread spends ``save / (every × step)``
of its time saving.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import gradientmail as gm
from demo.data import BatchSampler, load_corpus
from demo.model import GPT, loss_fn, make_optimizer
from demo.model_config import DEFAULT_CONFIG
from gradientmail.session.resume import LearnerState, StateFile, StateInMailbox
from gradientmail.store import RunStore
from testing.seaweed import Seaweed

SAVE_EVERY = 100
"""The default ``save_state_every``, for the share of training time."""


def train_step(model: GPT, optimizer: torch.optim.Optimizer, batches: BatchSampler) -> None:
    inputs, targets = batches.next()
    loss = loss_fn(model, inputs, targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def timed(action: object, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``action``."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4 * DEFAULT_CONFIG.width)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    config = DEFAULT_CONFIG.__class__(**{**DEFAULT_CONFIG.__dict__, "width": args.width})
    torch.manual_seed(0)
    model = GPT(config)
    optimizer = make_optimizer(model, 1e-3)
    batches = BatchSampler(load_corpus().train, 16, config.context, seed=0)
    for _ in range(3):
        train_step(model, optimizer, batches)  # Adam's moments exist from the first step
    parameters = sum(p.numel() for p in model.parameters())
    step_s = timed(lambda: train_step(model, optimizer, batches), args.repeats)
    print(f"learner state: GPT width {args.width}, {parameters / 1e6:.1f}M parameters, Adam; {os.cpu_count()} cores")
    print(f"reference: one training step, batch 16 x {config.context}: {step_s * 1000:.0f} ms")
    with tempfile.TemporaryDirectory(prefix="gm-state-") as tmp:
        root = Path(tmp)
        seaweed = Seaweed.start(root / "seaweedfs", bucket="gradientmail-state")
        try:
            os.environ.update(seaweed.server.env)
            s3 = gm.open_mailbox(seaweed.server.url("state"))
            places = {
                "local directory": StateFile(root / "dir", "gpu-0"),
                "directory mailbox": StateInMailbox(RunStore(gm.FileMailbox(root / "box")), "gpu-0"),
                "S3 mailbox (loopback SeaweedFS)": StateInMailbox(RunStore(s3), "gpu-0"),
            }
            for name, where in places.items():
                state = LearnerState(where, "gpu-0")
                save_s = timed(lambda: state.save("run", 1000, [optimizer]), args.repeats)
                load_s = timed(lambda: state.load("run"), args.repeats)
                loaded = state.load("run")
                assert loaded is not None
                moments = loaded["objects"][0]["state"]
                same = all(
                    np.array_equal(moments[i]["exp_avg"].numpy(), optimizer.state_dict()["state"][i]["exp_avg"].numpy())
                    for i in moments
                )
                size = sum(t.numel() * t.element_size() for s in optimizer.state_dict()["state"].values() for t in s.values())
                print(
                    f"  {name:33s} save {save_s * 1000:7.0f} ms = {save_s / step_s:5.2f} steps "
                    f"({save_s / (SAVE_EVERY * step_s):.2%} of training at save_state_every={SAVE_EVERY}); "
                    f"load {load_s * 1000:6.0f} ms; moments {size / 2**20:.0f} MiB, restored exactly: {same}"
                )
            s3.close()
        finally:
            seaweed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
