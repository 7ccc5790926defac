"""One learner that is a whole multi-GPU machine: torchrun's ranks train the demo GPT with DDP
(or, with --fsdp, sharded by FSDP2) and the run sees them as one learner (gradientmail/session/group.py).

    torchrun --standalone --nproc-per-node 8 examples/torchrun_learner.py --mailbox s3://my-training/runs/gpt --learner-id node-a
    torchrun --standalone --nproc-per-node 8 examples/torchrun_learner.py --mailbox s3://my-training/runs/gpt --learner-id node-b

On a CPU machine, two ranks on the gloo backend (the tests run this):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 examples/torchrun_learner.py \
        --mailbox file:///tmp/gpt --learner-id a

Under `gradientmail node` (compose's `--profile gpu-pair`, the chart's `learners.torchrun`) the run's
settings come from the GRADIENTMAIL_* variables, as for any node script. Every rank builds the
same session around the same model; rank 0 joins the run, publishes and aligns, and the others
follow it at every step (one small broadcast, and the parameters after an alignment; under FSDP
the ranks also gather a fragment for rank 0 to publish). Each rank draws its own batches
(seeded by learner id and rank); samples are per rank, and the session counts the group's
(× the number of ranks).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

import gradientmail as gm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, where the demo's GPT lives
from demo.data import BatchSampler, CorpusMissing, load_corpus, validation_windows
from demo.model import GPT, GPTConfig, evaluate, make_optimizer

MODEL = GPTConfig(context=128, layers=4, width=128, heads=4)
BATCH, LR, STEPS, LOG_EVERY, HELD_OUT_WINDOWS = 16, 1e-3, 1000, 25, 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mailbox", help="default: $GRADIENTMAIL_MAILBOX")
    parser.add_argument("--learner-id", help="default: $GRADIENTMAIL_LEARNER_ID, else the host name")
    parser.add_argument("--steps", type=int, default=None, help=f"default: $GRADIENTMAIL_STEPS, else {STEPS}")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--sync-every", type=int, default=None, help="default: $GRADIENTMAIL_SYNC_EVERY, else the library's")
    parser.add_argument("--fragments", type=int, default=None, help="default: $GRADIENTMAIL_FRAGMENTS, else the library's")
    parser.add_argument("--log-every", type=int, default=LOG_EVERY)
    parser.add_argument("--fsdp", action="store_true", help="shard parameters and optimizer state with FSDP2 instead of DDP")
    args = parser.parse_args()
    if not (args.mailbox or os.environ.get("GRADIENTMAIL_MAILBOX")):
        parser.error("give --mailbox or set GRADIENTMAIL_MAILBOX")
    # the run's settings: the command line's, else GRADIENTMAIL_* (as under `gradientmail node`)
    given = {"mailbox": args.mailbox, "learner_id": args.learner_id, "sync_every": args.sync_every, "fragments": args.fragments}
    overrides = {name: value for name, value in given.items() if value is not None}
    steps = args.steps or gm.NodeSettings.from_env(**overrides).steps or STEPS
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():  # `gradientmail node` under torchrun initialised it already
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    try:
        corpus = load_corpus()
    except CorpusMissing as exc:
        raise SystemExit(str(exc)) from None
    model = GPT(MODEL).to(device)  # the same seeded weights on every rank
    if args.fsdp:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)  # the model itself, its parameters now shards
    else:
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = make_optimizer(model, LR)
    with gm.session_from_env(wrapped, **overrides) as session:
        seed = zlib.crc32(f"{session.learner_id}/{rank}".encode())  # every rank its own windows
        batches = BatchSampler(corpus.train, args.batch, MODEL.context, seed=seed)
        for step in range(1, steps + 1):
            inputs, targets = (torch.from_numpy(a).to(device) for a in batches.next())
            logits = wrapped(inputs)  # through DDP or FSDP: their backward averages the gradients
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as examples/torch_learner.py does
            optimizer.step()
            session.step(samples=batches.tokens_per_batch)
            if rank == 0 and (step % args.log_every == 0 or step == steps):
                print(
                    f"{session.learner_id}: step {step:5d}  loss {loss.item():.3f}  versions {dict(session.versions)}", flush=True
                )
        name = session.learner_id
    if rank == 0 or args.fsdp:  # closing set every rank to the newest commit: evaluate it (FSDP: every rank takes part)
        held_out_loss = evaluate(model, validation_windows(corpus.validation, HELD_OUT_WINDOWS, MODEL.context))
    if rank == 0:
        print(f"{name}: committed model, held-out loss {held_out_loss:.3f} ({held_out_loss / math.log(2):.2f} bits/byte)")
    dist.barrier()  # every rank done (rank 0 evaluated) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
