"""A tiny GPT in PyTorch (nanoGPT-like), sized for several steps per second on one CPU thread.

The one PyTorch GPT of the repository: the demo trains it and ``examples/torch_learner.py``
imports it. ``model_mlx.py`` holds its twin; both must keep identical parameter names, shapes
and dtypes so that a PyTorch learner and an MLX learner can train one run together (their
shared shape and initial values are in ``model_config.py``). The embeddings are named
``*_embed`` because the default merge averages tensors whose name contains ``embed``
directly instead of with RDA.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from demo.model_config import DEFAULT_CONFIG, GPTConfig, ParameterSignature, init_parameters

__all__ = ["GPTConfig", "GPT", "loss_fn", "train_step", "make_optimizer", "evaluate"]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        # (batch, heads, length, head_width)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.width)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.width)
        self.fc = nn.Linear(config.width, config.mlp_width)
        self.out = nn.Linear(config.mlp_width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Token + position embeddings, pre-LN blocks, final LayerNorm, untied output head."""

    def __init__(self, config: GPTConfig = DEFAULT_CONFIG, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.tok_embed = nn.Embedding(config.vocab_size, config.width)
        self.pos_embed = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size)
        self.load_numpy(init_parameters(self.numpy_signature(), config, seed))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch, length, vocab) for int64 ``tokens`` of shape (batch, length)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_embed(tokens) + self.pos_embed(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def numpy_signature(self) -> ParameterSignature:
        """Name → (shape, dtype name) of every parameter, in registration order."""
        return {name: (tuple(p.shape), str(p.dtype).removeprefix("torch.")) for name, p in self.named_parameters()}

    def to_numpy(self) -> dict[str, np.ndarray]:
        return {name: p.detach().cpu().numpy().copy() for name, p in self.named_parameters()}

    def load_numpy(self, values: dict[str, np.ndarray]) -> None:
        """Copy parameters in by name (for init and for moving weights from the MLX twin)."""
        with torch.no_grad():
            for name, parameter in self.named_parameters():
                parameter.copy_(torch.from_numpy(np.ascontiguousarray(values[name])))


def loss_fn(model: GPT, inputs: np.ndarray, targets: np.ndarray) -> torch.Tensor:
    """Mean next-byte cross-entropy in nats (ln 256 ≈ 5.55 for a uniform guess).

    The NumPy batch moves to the model's device, so the same loop runs on a CPU or a GPU.
    """
    device = model.head.weight.device
    logits = model(torch.from_numpy(inputs).to(device))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(targets).to(device).reshape(-1))


def make_optimizer(model: GPT, lr: float) -> torch.optim.Optimizer:
    """AdamW, the inner optimizer; its state stays local to each learner."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)


def train_step(model: GPT, optimizer: torch.optim.Optimizer, batch: tuple[np.ndarray, np.ndarray]) -> float:
    """One AdamW update on ``batch``; returns the loss before the update."""
    model.train()
    loss = loss_fn(model, *batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def evaluate(model: GPT, data: tuple[np.ndarray, np.ndarray], batch_size: int = 64) -> float:
    """Mean validation loss over the windows in ``data`` (see ``data.validation_windows``)."""
    model.eval()
    inputs, targets = data
    total = 0.0
    for start in range(0, len(inputs), batch_size):
        chunk = slice(start, start + batch_size)
        total += float(loss_fn(model, inputs[chunk], targets[chunk])) * len(inputs[chunk])
    return total / len(inputs)
