"""A learner that trains a few steps, then waits at a barrier (``session.barrier``): what
``tests/test_barrier_processes.py`` runs, side by side and killed. Prints a JSON line as it
arrives, and one with the release and this process's wall clock when the wait returns."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

import gradientmail as gm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mailbox", required=True)
    parser.add_argument("--learner-id", required=True)
    parser.add_argument("--parties", type=int, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--margin", type=float, default=3.0)
    args = parser.parse_args()
    model = {"w": np.zeros(16, np.float32)}
    options = gm.SessionOptions(lease_ttl_s=2.0, poll_interval_s=0.05)
    algorithm = gm.DiLoCo(sync_every=5)
    with gm.Session(model, algorithm=algorithm, mailbox=args.mailbox, learner_id=args.learner_id, options=options) as s:
        for _ in range(args.steps):
            model["w"] += 0.01
            s.step(samples=8)
            time.sleep(args.step_sleep)
        print(json.dumps({"event": "arriving", "wall": time.time()}), flush=True)
        release = s.barrier("epoch-1", args.parties, timeout_s=60, margin_s=args.margin, settle_s=0.5, poll_interval_s=0.2)
        returned = time.time()
        print(json.dumps({"event": "released", "wall": returned, **dataclasses.asdict(release)}), flush=True)


if __name__ == "__main__":
    main()
