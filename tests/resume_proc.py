"""A PyTorch learner with an Adam optimizer and a learning-rate schedule that saves its state
(``SessionOptions.state_dir``) and resumes from it: what ``tests/test_resume.py`` kills and
restarts. Prints one JSON line per event: ``opened`` (with the resumed step and a digest of the
optimizer's moments as restored), ``step`` every step, ``closed``."""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch

import gradientmail as gm


def moments_digest(optimizer: torch.optim.Optimizer) -> str:
    digest = hashlib.sha256()
    for state in optimizer.state_dict()["state"].values():
        for name in ("exp_avg", "exp_avg_sq"):
            digest.update(state[name].numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mailbox", required=True)
    parser.add_argument("--learner-id", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.01)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=25, gamma=0.5)
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.05, state_dir=args.state_dir, save_state_every=args.save_every)
    session = gm.Session(
        model, algorithm=gm.DiLoCo(sync_every=10, fragments=1), mailbox=args.mailbox, learner_id=args.learner_id, options=options
    )
    session.register_for_checkpointing(optimizer, schedule)
    with session:
        event = {"event": "opened", "total_steps": session.total_steps, "lr": schedule.get_last_lr()[0]}
        if optimizer.state:
            event["moments"] = moments_digest(optimizer)
        event["rand"] = torch.rand(1).item()
        print(json.dumps(event), flush=True)
        torch.manual_seed(1000 + session.total_steps)  # the data stream follows the step count
        while session.total_steps < args.steps:
            x = torch.randn(16, 8)
            loss = (model(x) - x[:, :4]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            session.step(samples=16)
            print(json.dumps({"event": "step", "total_steps": session.total_steps}), flush=True)
            time.sleep(args.step_sleep)
    print(json.dumps({"event": "closed", "total_steps": session.total_steps}), flush=True)


if __name__ == "__main__":
    main()
