"""Shared parametrisation: every test that takes ``backend`` runs on all three frameworks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gradientmail.backends import Backend

BACKENDS = ("numpy", "torch", "mlx")


def tensor(backend: Backend, values: Sequence[float] | np.ndarray, dtype: str = "float32"):
    """A backend tensor from Python values."""
    return backend.cast(backend.from_numpy(np.asarray(values, dtype=np.float32)), dtype)


def values(backend: Backend, t) -> np.ndarray:
    """The tensor's values as float64 NumPy, for comparisons."""
    return backend.to_numpy(backend.to_fp32(t)).astype(np.float64)
