"""A small learner process for the multi-process tests: ``python -m tests.learner_proc …``.

Each learner pulls a tiny model (``embed.weight``, ``layer.weight``, ``layer.bias``, the same
names in NumPy, PyTorch and MLX) toward its own target with noisy SGD, paced by a sleep,
inside a real ``gm.Session``. At the end it writes what it saw as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import gradientmail as gm
from gradientmail.mailbox import open_mailbox
from gradientmail.session import Session, SessionOptions
from gradientmail.store import RunStore

SHAPES = {"embed.weight": (8, 4), "layer.weight": (4, 4), "layer.bias": (4,)}


def build_model(framework: str, seed: int):
    rng = np.random.default_rng(seed)
    init = {name: (0.1 * rng.standard_normal(shape)).astype(np.float32) for name, shape in SHAPES.items()}
    if framework == "numpy":
        return init
    if framework == "torch":
        import torch

        class Tiny(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = torch.nn.Embedding(8, 4)
                self.layer = torch.nn.Linear(4, 4)

        model = Tiny()
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(torch.from_numpy(init[name]))
        return model
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_unflatten

    class TinyMlx(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(8, 4)
            self.layer = nn.Linear(4, 4)

    model = TinyMlx()
    model.update(tree_unflatten([(k, mx.array(v)) for k, v in init.items()]))
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mailbox", required=True)
    parser.add_argument("--learner-id", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-sleep", type=float, default=0.01)
    parser.add_argument("--sync-every", type=int, default=10)
    parser.add_argument("--fragments", type=int, default=2)
    parser.add_argument("--quorum", type=int, default=1)
    parser.add_argument("--merge", choices=["rda", "weighted_mean", "local_sgd"], default="rda")
    parser.add_argument("--overlap-steps", type=int, default=None)
    parser.add_argument("--flush", action="store_true")
    parser.add_argument("--no-carry", dest="carry", action="store_false", help="the guide's behaviour: aligning drops work")
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--poll", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--framework", choices=["numpy", "torch", "mlx"], default="numpy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--wait-for", type=int, default=0, help="start training once this many learners hold leases")
    parser.add_argument("--end-together", type=int, default=0, help="close once this many learners finished and uploaded")
    parser.add_argument(
        "--keep-versions", type=int, default=1_000_000, help="retention (default: keep every version, so tests see all history)"
    )
    parser.add_argument("--run-key", default=None, help="sign the run's records with this key")
    parser.add_argument("--role", choices=["both", "learner", "either"], default="both")
    parser.add_argument(
        "--global-batch", type=int, default=None, help="the run's global_batch_size; steps take session.batch_size"
    )
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on 127.0.0.1:PORT")
    parser.add_argument("--compress", action="store_true", help="payload_compression='zstd'")
    args = parser.parse_args(argv)
    if args.metrics_port is not None:
        gm.telemetry.configure(node=args.learner_id, prometheus_port=args.metrics_port, prometheus_address="127.0.0.1")

    settings = dict(
        sync_every=args.sync_every,
        fragments=args.fragments,
        quorum_size=args.quorum,
        overlap_steps=args.overlap_steps,
        flush_on_close=args.flush,
        carry_unmerged=args.carry,
        global_batch_size=args.global_batch,
        payload_compression="zstd" if args.compress else "none",
    )
    if args.merge == "local_sgd":
        algorithm = gm.DiLoCo.local_sgd(**settings)
    else:
        merge = gm.Rda() if args.merge == "rda" else gm.WeightedMean()
        algorithm = gm.DiLoCo(merge=merge, **settings)
    model = build_model(args.framework, seed=0)
    backend = gm.backend_for(model)
    rng = np.random.default_rng(args.seed + 1000)
    target = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
    options = SessionOptions(lease_ttl_s=args.ttl, poll_interval_s=args.poll, role=args.role)
    # the test's own road to the mailbox: to count the learners' leases and for the end barrier
    harness = open_mailbox(args.mailbox)
    retention = gm.Retention(keep_versions=args.keep_versions, audit_rounds=min(8, args.keep_versions - 1))
    with Session(
        model,
        algorithm=algorithm,
        mailbox=args.mailbox,
        learner_id=args.learner_id,
        options=options,
        retention=retention,
        run_key=args.run_key,
    ) as session:
        deadline = time.monotonic() + 60
        while len(RunStore(harness).leases.learner_keys()) < args.wait_for and time.monotonic() < deadline:
            time.sleep(0.02)
        joined = dict(session.versions)
        print(json.dumps({"event": "joined", "learner": args.learner_id, "versions": joined}), flush=True)
        batch = None
        for step in range(args.steps):
            if args.global_batch is not None and session.batch_size != batch:
                batch = session.batch_size
                print(json.dumps({"event": "batch", "learner": args.learner_id, "step": step, "batch": batch}), flush=True)
            current = {n: backend.to_numpy(backend.to_fp32(t)) for n, t in backend.named_parameters(model)}
            noise = {n: 0.01 * rng.standard_normal(SHAPES[n]).astype(np.float32) for n in SHAPES}
            updated = {n: current[n] - 0.05 * (current[n] - target[n]) + noise[n] for n in SHAPES}
            backend.write_parameters(model, {n: backend.from_numpy(v) for n, v in updated.items()})
            session.step(samples=batch if batch is not None else args.batch)
            session.report(loss=float(np.mean([np.mean((updated[n] - target[n]) ** 2) for n in SHAPES])))
            if step % 10 == 0:
                print(
                    json.dumps({"event": "step", "learner": args.learner_id, "step": step, "versions": dict(session.versions)}),
                    flush=True,
                )
            time.sleep(args.step_sleep)
        if args.end_together:
            session.wait_published()
            harness.put(f"test-barrier/{args.learner_id}", b"done")
            while len(harness.list("test-barrier/")) < args.end_together and time.monotonic() < deadline + 120:
                time.sleep(0.02)
    harness.close()
    final = {n: backend.to_numpy(backend.to_fp32(t)).tolist() for n, t in backend.named_parameters(model)}
    result = {
        "event": "done",
        "learner": args.learner_id,
        "versions": dict(session.versions),
        "stats": session.stats.__dict__,
        "ledger": [view.as_json() for view in session.ledger],
        "params": final,
        "joined": joined,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "params"}), flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle)


if __name__ == "__main__":
    sys.exit(main())
