"""What the PyTorch and MLX GPT twins share, free of either framework: shape and initial values.

Kept apart from ``model.py`` so that an MLX learner (``model_mlx.py``, ``examples/mlx_learner.py``)
never imports PyTorch, and the launcher, worker and baseline can size a model before choosing
a framework.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from demo.data import VOCAB_SIZE

__all__ = ["GPTConfig", "ParameterSignature", "init_parameters"]

ParameterSignature = dict[str, tuple[tuple[int, ...], str]]
"""Parameter name → (shape, dtype name), as each twin's ``numpy_signature()`` reports it."""


@dataclass(frozen=True)
class GPTConfig:
    """Model shape; the defaults take ~0.1 s per step of 16×96 tokens on one thread."""

    vocab_size: int = VOCAB_SIZE
    context: int = 96
    layers: int = 3
    width: int = 128
    heads: int = 4

    @property
    def mlp_width(self) -> int:
        return 4 * self.width


DEFAULT_CONFIG = GPTConfig()
"""The demo's model, shared by its learners, the baseline and the examples' defaults."""


def init_parameters(signature: ParameterSignature, config: GPTConfig, seed: int) -> dict[str, np.ndarray]:
    """GPT-2-style initial values drawn with NumPy, so both twins start from the same bytes.

    Weights ~ N(0, 0.02) (residual projections scaled by 1/sqrt(2·layers)), biases 0,
    LayerNorm gains 1.
    """
    rng = np.random.default_rng(seed)
    values: dict[str, np.ndarray] = {}
    for name in sorted(signature):  # sorted: the twins may register parameters in another order
        shape, dtype = signature[name]
        if name.endswith("bias"):
            value = np.zeros(shape)
        elif ".ln" in name or name.startswith("ln"):
            value = np.ones(shape)
        else:
            std = 0.02 / math.sqrt(2 * config.layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
            value = rng.normal(0.0, std, size=shape)
        values[name] = value.astype(dtype)
    return values
