"""A learner that trains the units of a shared work queue (``session.queue``), a few steps each:
what ``tests/test_work_queue.py`` runs, kills and restarts. Prints a JSON line when it starts a
unit (with the steps of it to skip, ``steps_into``), after each step and, at the end, the units it
marked done. With ``--state-dir`` it saves its learner state at every step."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import gradientmail as gm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mailbox", required=True)
    parser.add_argument("--learner-id", required=True)
    parser.add_argument("--units", type=int, default=24)
    parser.add_argument("--steps-per-unit", type=int, default=5)
    parser.add_argument("--step-sleep", type=float, default=0.02)
    parser.add_argument("--state-dir", default=None)
    parser.add_argument("--lease-ttl", type=float, default=1.0)
    args = parser.parse_args()
    model = {"w": np.zeros(16, np.float32)}
    options = gm.SessionOptions(lease_ttl_s=args.lease_ttl, poll_interval_s=0.05, state_dir=args.state_dir, save_state_every=1)
    algorithm = gm.DiLoCo(sync_every=10, fragments=1)
    with gm.Session(model, algorithm=algorithm, mailbox=args.mailbox, learner_id=args.learner_id, options=options) as session:
        queue = session.queue("shards", units=args.units)
        for unit in queue:
            skip = queue.steps_into(unit)
            print(json.dumps({"event": "unit", "unit": unit, "skip": skip}), flush=True)
            for step in range(skip, args.steps_per_unit):
                model["w"] += 0.01
                session.step(samples=8)
                print(json.dumps({"event": "step", "unit": unit, "step": step}), flush=True)
                time.sleep(args.step_sleep)
        print(json.dumps({"event": "end", "completed": queue.completed, "taken_over": queue.taken_over}), flush=True)


if __name__ == "__main__":
    main()
