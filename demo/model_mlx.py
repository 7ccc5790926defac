"""The tiny GPT of ``model.py`` in MLX: same architecture, parameter names, shapes and dtypes.

The one MLX GPT of the repository: the demo's MLX learners and ``examples/mlx_learner.py``
use it. Identical signatures let an MLX learner (a Mac, or Linux CPU in CI) join a run
started by PyTorch learners: the manifest pins the signature and the exchange moves tensors
by name. It imports no PyTorch: the shared shape and initial values come from ``model_config``.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from demo.model_config import DEFAULT_CONFIG, GPTConfig, ParameterSignature, init_parameters

__all__ = ["GPTConfig", "GPT", "loss_fn", "make_optimizer", "train_step", "evaluate"]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)

    def __call__(self, x: mx.array) -> mx.array:
        batch, length, width = x.shape
        q, k, v = mx.split(self.qkv(x), 3, axis=-1)
        q, k, v = (t.reshape(batch, length, self.heads, width // self.heads).transpose(0, 2, 1, 3) for t in (q, k, v))
        y = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(width // self.heads), mask="causal")
        return self.proj(y.transpose(0, 2, 1, 3).reshape(batch, length, width))


class Block(nn.Module):
    """Pre-LayerNorm transformer block, as in ``model.Block``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.width)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.width)
        self.fc = nn.Linear(config.width, config.mlp_width)
        self.out = nn.Linear(config.mlp_width, config.width)

    def __call__(self, x: mx.array) -> mx.array:
        x = x + self.attn(self.ln1(x))
        return x + self.out(nn.gelu_approx(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Token + position embeddings, pre-LN blocks, final LayerNorm, untied output head."""

    def __init__(self, config: GPTConfig = DEFAULT_CONFIG, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.tok_embed = nn.Embedding(config.vocab_size, config.width)
        self.pos_embed = nn.Embedding(config.context, config.width)
        self.blocks = [Block(config) for _ in range(config.layers)]
        self.ln_f = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size)
        self.load_numpy(init_parameters(self.numpy_signature(), config, seed))

    def __call__(self, tokens: mx.array) -> mx.array:
        x = self.tok_embed(tokens) + self.pos_embed(mx.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def numpy_signature(self) -> ParameterSignature:
        """Name → (shape, dtype name) of every parameter, comparable with ``model.GPT``'s."""
        return {
            name: (tuple(value.shape), str(value.dtype).removeprefix("mlx.core."))
            for name, value in tree_flatten(self.parameters())
        }

    def to_numpy(self) -> dict[str, np.ndarray]:
        return {name: np.array(value) for name, value in tree_flatten(self.parameters())}

    def load_numpy(self, values: dict[str, np.ndarray]) -> None:
        """Replace parameters by name (for init and for moving weights from the PyTorch twin)."""
        names = [name for name, _ in tree_flatten(self.parameters())]
        self.update(tree_unflatten([(name, mx.array(np.ascontiguousarray(values[name]))) for name in names]))
        mx.eval(self.parameters())


def loss_fn(model: GPT, inputs: mx.array, targets: mx.array) -> mx.array:
    """Mean next-byte cross-entropy in nats, as ``model.loss_fn``."""
    return nn.losses.cross_entropy(model(inputs), targets, reduction="mean")


def make_optimizer(model: GPT, lr: float) -> optim.Optimizer:
    """AdamW with the PyTorch learner's settings (MLX's own defaults differ)."""
    return optim.AdamW(learning_rate=lr, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.01, bias_correction=True)


def train_step(model: GPT, optimizer: optim.Optimizer, batch: tuple[np.ndarray, np.ndarray]) -> float:
    """One AdamW update on ``batch`` with the gradient norm clipped to 1; returns the loss."""
    loss, grads = nn.value_and_grad(model, loss_fn)(model, mx.array(batch[0]), mx.array(batch[1]))
    grads, _ = optim.clip_grad_norm(grads, max_norm=1.0)
    optimizer.update(model, grads)
    mx.eval(model.parameters(), optimizer.state, loss)
    return loss.item()


def evaluate(model: GPT, data: tuple[np.ndarray, np.ndarray], batch_size: int = 64) -> float:
    """Mean validation loss over the windows in ``data`` (see ``data.validation_windows``)."""
    inputs, targets = data
    total = 0.0
    for start in range(0, len(inputs), batch_size):
        chunk = slice(start, start + batch_size)
        loss = loss_fn(model, mx.array(inputs[chunk]), mx.array(targets[chunk]))
        total += loss.item() * len(inputs[chunk])
    return total / len(inputs)
