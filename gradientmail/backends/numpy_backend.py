"""NumPy backend: a "model" is a mutable mapping of names to arrays (model order = key order)."""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np

from gradientmail.backends.base import Backend, Tensor
from gradientmail.backends.payload import FLOAT_DTYPES, dtype_name_of, numpy_dtype

_CHUNK = 1 << 20
"""Elements per pass of the reductions: bounds their temporary memory at a few MB."""


class NumpyBackend(Backend):
    name = "numpy"

    def owns(self, obj: object) -> bool:
        if isinstance(obj, np.ndarray):
            return True
        return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, np.ndarray) for v in obj.values())

    def to_fp32(self, tensor: Tensor) -> np.ndarray:
        return np.asarray(tensor).astype(np.float32, copy=True)

    def norm(self, tensor: Tensor) -> float:
        # fp64 sums over bounded chunks: exact enough, and no full-size fp64 copy of a large delta
        flat = np.asarray(tensor).reshape(-1)
        total = 0.0
        for start in range(0, flat.size, _CHUNK):
            chunk = flat[start : start + _CHUNK].astype(np.float64)
            total += float(np.dot(chunk, chunk))
        return math.sqrt(total)

    def scale(self, tensor: Tensor, factor: float) -> np.ndarray:
        scaled: np.ndarray = np.asarray(tensor, dtype=np.float32) * np.float32(factor)  # NumPy's stubs type the product as Any
        return scaled

    def add(self, a: Tensor, b: Tensor) -> np.ndarray:
        return np.asarray(a, dtype=np.float32) + np.asarray(b, dtype=np.float32)

    def sub(self, a: Tensor, b: Tensor) -> np.ndarray:
        return np.asarray(a, dtype=np.float32) - np.asarray(b, dtype=np.float32)

    def zeros_like(self, tensor: Tensor) -> np.ndarray:
        return np.zeros(np.shape(tensor), dtype=np.float32)

    def all_finite(self, tensor: Tensor) -> bool:
        array = np.asarray(tensor)
        if dtype_name_of(array) not in FLOAT_DTYPES:
            return True
        flat = array.reshape(-1)
        native = array.dtype in (np.float16, np.float32, np.float64)
        for start in range(0, flat.size, _CHUNK):
            chunk = flat[start : start + _CHUNK]
            if not np.isfinite(chunk if native else chunk.astype(np.float32)).all():
                return False
        return True

    def cast(self, tensor: Tensor, dtype: str) -> np.ndarray:
        return np.asarray(tensor).astype(numpy_dtype(dtype))

    def dtype_name(self, tensor: Tensor) -> str:
        return dtype_name_of(np.asarray(tensor))

    def shape(self, tensor: Tensor) -> tuple[int, ...]:
        return tuple(int(d) for d in np.shape(tensor))

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        return np.asarray(tensor)

    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def copy(self, tensor: Tensor) -> np.ndarray:
        return np.array(tensor, copy=True)

    def named_parameters(self, model: Any) -> list[tuple[str, Tensor]]:
        if not isinstance(model, Mapping):
            raise TypeError("a NumPy model is a mapping of parameter names to arrays")
        return list(model.items())

    def write_parameters(self, model: Any, values: Mapping[str, Tensor]) -> None:
        if not isinstance(model, MutableMapping):
            raise TypeError("a NumPy model is a mutable mapping of parameter names to arrays")
        for name, value in values.items():
            target = model[name]
            target[...] = np.asarray(value).astype(target.dtype)
