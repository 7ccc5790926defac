"""NumPy backend: a "model" is a mutable mapping of names to arrays (model order = key order)."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np

from gradientmail.backends.base import Backend, Tensor
from gradientmail.backends.payload import FLOAT_DTYPES, dtype_name_of, numpy_dtype


class NumpyBackend(Backend):
    name = "numpy"

    def owns(self, obj: object) -> bool:
        if isinstance(obj, np.ndarray):
            return True
        return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, np.ndarray) for v in obj.values())

    def to_fp32(self, tensor: Tensor) -> np.ndarray:
        return np.asarray(tensor).astype(np.float32, copy=True)

    def norm(self, tensor: Tensor) -> float:
        flat = np.asarray(tensor, dtype=np.float32).reshape(-1).astype(np.float64)
        return float(np.sqrt(np.dot(flat, flat)))

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
        return bool(np.isfinite(array.astype(np.float64)).all())

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
