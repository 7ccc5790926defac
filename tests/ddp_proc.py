"""One learner that is a torchrun group: DDP (or FSDP2 with ``--fsdp``) over the gloo backend on
CPU, every rank around the same ``gm.Session``. What ``tests/test_torchrun_learner.py`` starts
(two of them). Each rank writes ``{out}.rank{r}.json`` at the end: its learner id, steps, the
digest of its (full, gathered) parameters and, on rank 0, of the session's view of them."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

import gradientmail as gm


def digest(module: torch.nn.Module, *, gather: bool) -> str:
    """sha256 of the parameters in name order; ``gather``: of the full tensors of FSDP's shards."""
    hashed = hashlib.sha256()
    with torch.no_grad():
        for _, tensor in sorted(module.named_parameters(), key=lambda item: item[0]):
            full = tensor.full_tensor() if gather else tensor  # type: ignore[operator]
            hashed.update(full.detach().numpy().tobytes())
    return hashed.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mailbox", required=True)
    parser.add_argument("--learner-id", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--step-sleep", type=float, default=0.01)
    parser.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2 instead of DDP")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial replica on every rank (DDP checks it too)
    if args.fsdp:
        model = fully_shard(torch.nn.Linear(6, 3), mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    else:
        model = DistributedDataParallel(torch.nn.Linear(6, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    options = gm.SessionOptions(lease_ttl_s=2.0, poll_interval_s=0.05)
    algorithm = gm.DiLoCo(sync_every=10, fragments=1)
    generator = torch.Generator().manual_seed(1000 * (1 + rank) + sum(map(ord, args.learner_id)))
    keep_all = gm.Retention(keep_versions=1_000_000)  # the test checks every version
    session = gm.Session(
        model, algorithm=algorithm, mailbox=args.mailbox, learner_id=args.learner_id, options=options, retention=keep_all
    )
    with session:
        for _ in range(args.steps):
            x = torch.randn(args.batch, 6, generator=generator)
            loss = (model(x) - x[:, :3]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.step(samples=args.batch)
            time.sleep(args.step_sleep)
    module = model if args.fsdp else model.module
    result = {
        "rank": rank,
        "learner": args.learner_id,
        "steps": session.stats.steps,
        "params": digest(module, gather=args.fsdp),
        "view": digest(session.model, gather=False) if rank == 0 else None,
        "sharded": session.group is not None and session.group.sharded,
        "versions": dict(session.versions) if rank == 0 else None,
        "leader": session.group is not None and session.group.is_leader,
        "world": session.group.world_size if session.group is not None else 1,
        "pid": os.getpid(),
    }
    with open(f"{args.out}.rank{rank}.json", "w") as out:
        json.dump(result, out)
    dist.barrier()  # every rank done (rank 0 evaluated) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
