"""What ``session.step()`` costs when nothing is due, side by side with a bare loop and a real step.

Prints per-step times measured in one run: an empty loop, the same loop calling
``session.step()``, and one optimizer step of a tiny PyTorch model, so the overhead reads as
a ratio against real work. Run: python benchmarks/step_overhead.py
"""

from __future__ import annotations

import time

import numpy as np
import torch

import gradientmail as gm

STEPS = 200_000


def per_step(loop, steps: int) -> float:
    started = time.perf_counter()
    loop(steps)
    return (time.perf_counter() - started) / steps


def main() -> None:
    model = {"w": np.zeros((64, 64), np.float32)}
    algorithm = gm.DiLoCo(sync_every=10**9)  # nothing comes due during the measurement
    options = gm.SessionOptions(run_syncer=False)
    with gm.Session(model, algorithm=algorithm, mailbox=gm.MemoryMailbox(), learner_id="bench", options=options) as session:

        def empty(steps: int) -> None:
            for _ in range(steps):
                pass

        def stepping(steps: int) -> None:
            for _ in range(steps):
                session.step(samples=32)

        bare = per_step(empty, STEPS)
        with_session = per_step(stepping, STEPS)

    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(net.parameters())
    x, y = torch.randn(32, 64), torch.randn(32, 1)

    def train(steps: int) -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()

    real = per_step(train, 2_000)
    overhead = with_session - bare
    print(f"empty loop             {bare * 1e6:8.3f} µs/step")
    print(f"loop + session.step()  {with_session * 1e6:8.3f} µs/step  (overhead {overhead * 1e6:.3f} µs)")
    print(f"tiny torch train step  {real * 1e6:8.1f} µs/step")
    print(f"overhead / tiny step   {overhead / real:8.4%}")


if __name__ == "__main__":
    main()
