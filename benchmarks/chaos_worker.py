"""One learner of the chaos benchmark: ``python -m benchmarks.chaos_worker --mailbox URL --learner-id ID …``.

A tiny model (a dict of float32 NumPy arrays) pulled toward its own target by noisy SGD,
paced by a sleep per step, inside a real ``gm.Session``. Before each ``session.step()`` it
appends its running step count to ``--progress`` (one JSON line, flushed), so the steps of
a process killed with ``kill -9`` are still counted: a step is counted once trained, whether
or not it ever reaches a commit. Whenever the session's step ledger (``session.ledger``) or its
count of contributions changes, a ``ledger`` line records it, so the ledger of a killed process
is known up to its last alignment, with the seconds the session waited for commits so far
(``blocked_s``) and the seconds since the process started (``trained_s``). SIGTERM (or
``--deadline``) ends training; the session then closes cleanly (publishing what is left with
``flush_on_close``) and a last ``closed`` line holds the session's figures and final ledger.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from typing import Any

import numpy as np

import gradientmail as gm

SHAPES = {"embed.weight": (8, 4), "layer.weight": (4, 4), "layer.bias": (4,)}


def build_algorithm(args: argparse.Namespace) -> gm.DiLoCo:
    return gm.DiLoCo(
        sync_every=args.sync_every,
        fragments=args.fragments,
        quorum_size=args.quorum,
        flush_on_close=True,
        syncer_layout=args.layout,
    )


def ledger_mark(session: gm.Session) -> tuple[int, ...]:
    """What changes when the ledger moves other than by training: merged and dropped steps per
    fragment, and the contributions published."""
    return (session.stats.contributions, *(n for view in session.ledger for n in (view.merged, view.dropped_steps)))


def ledger_json(session: gm.Session) -> list[dict[str, object]]:
    return [view.as_json() for view in session.ledger]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos_worker")
    parser.add_argument("--mailbox", required=True)
    parser.add_argument("--learner-id", required=True)
    parser.add_argument("--progress", required=True, help="JSON lines file the step count is appended to")
    parser.add_argument("--incarnation", type=int, default=0, help="how often this learner id was started before")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-sleep", type=float, default=0.03)
    parser.add_argument("--sync-every", type=int, default=20)
    parser.add_argument("--fragments", type=int, default=2)
    parser.add_argument("--quorum", type=int, default=2)
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--commit-timeout", type=float, default=10.0, help="longest close() waits for each own round")
    parser.add_argument("--deadline", type=float, default=None, help="wall-clock time (epoch seconds) to stop training at")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--layout", choices=["one", "spread"], default="one", help="the run's syncer_layout")
    args = parser.parse_args(argv)

    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    progress = open(args.progress, "a", buffering=1)  # noqa: SIM115 -- line-buffered, one write per line, kept open

    def note(**fields: Any) -> None:
        progress.write(
            json.dumps({"learner": args.learner_id, "incarnation": args.incarnation, "pid": os.getpid(), **fields}) + "\n"
        )

    rng = np.random.default_rng([args.seed, args.incarnation])
    init = np.random.default_rng(0)  # every learner starts from the same parameters (the run's version 0)
    model = {name: (0.1 * init.standard_normal(shape)).astype(np.float32) for name, shape in SHAPES.items()}
    target = {
        name: np.random.default_rng(1000 + args.seed).standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()
    }
    backend = gm.backend_for(model)
    options = gm.SessionOptions(lease_ttl_s=args.ttl, poll_interval_s=args.poll, commit_timeout_s=args.commit_timeout)
    steps = 0
    started = time.monotonic()
    note(event="start", steps=0)
    last_mark: tuple[int, ...] = ()
    with gm.Session(
        model, algorithm=build_algorithm(args), mailbox=args.mailbox, learner_id=args.learner_id, options=options
    ) as session:
        note(event="joined", steps=0, versions=dict(session.versions), join_s=round(time.monotonic() - started, 3))
        while not stop and (args.deadline is None or time.time() < args.deadline):
            current = {n: backend.to_numpy(backend.to_fp32(t)) for n, t in backend.named_parameters(model)}
            noise = {n: 0.01 * rng.standard_normal(SHAPES[n]).astype(np.float32) for n in SHAPES}
            updated = {n: current[n] - 0.05 * (current[n] - target[n]) + noise[n] for n in SHAPES}
            backend.write_parameters(model, {n: backend.from_numpy(v) for n, v in updated.items()})
            steps += 1
            note(steps=steps)  # counted as trained before the session can publish it
            session.step(samples=args.batch)
            mark = ledger_mark(session)
            if mark != last_mark:
                note(
                    event="ledger", steps=steps, contributions=session.stats.contributions, ledger=ledger_json(session),
                    blocked_s=round(session.stats.blocked_s, 3), trained_s=round(time.monotonic() - started, 3),
                )  # fmt: skip
                last_mark = mark
            time.sleep(args.step_sleep)
        closing = time.monotonic()
    stats = session.stats
    note(
        event="closed",
        steps=steps,
        close_s=round(time.monotonic() - closing, 3),
        contributions=stats.contributions,
        dropped_at_close=list(stats.dropped_at_close),
        versions=dict(session.versions),
        ledger=ledger_json(session),
    )
    progress.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
