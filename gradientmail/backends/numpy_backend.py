"""NumPy backend: a "model" is a mutable mapping of names to arrays (model order = key order).

Its arithmetic is the shared kernels of :mod:`gradientmail.backends.kernels` (fixed blocks,
a bounded thread pool, per-block reductions summed in order), which the PyTorch backend also
runs on host tensors, so both give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from gradientmail.backends.base import Backend, Tensor
from gradientmail.backends.host import HostBuffer
from gradientmail.backends.kernels import (
    accumulate_arrays,
    all_finite_array,
    combine_arrays,
    finite_norm_array,
    isotropic_exact_array,
    isotropic_fast_array,
    outer_arrays,
)
from gradientmail.backends.payload import FLOAT_DTYPES, dtype_name_of, numpy_dtype


class NumpyBackend(Backend):
    name = "numpy"
    reuses_host_buffers = True

    def owns(self, obj: object) -> bool:
        if isinstance(obj, np.ndarray):
            return True
        return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, np.ndarray) for v in obj.values())

    def to_fp32(self, tensor: Tensor) -> np.ndarray:
        return np.asarray(tensor).astype(np.float32, copy=True)

    def norm(self, tensor: Tensor) -> float:
        # fp64 sums over fixed blocks: exact enough, no full-size fp64 copy, no BLAS threads
        return finite_norm_array(np.asarray(tensor))

    def finite_norm(self, tensor: Tensor) -> float:
        return finite_norm_array(np.asarray(tensor))

    def combine(self, tensors: Sequence[Tensor], factors: Sequence[float]) -> np.ndarray:
        return combine_arrays([np.asarray(t) for t in tensors], factors)[0]

    def combine_sumsq(self, tensors: Sequence[Tensor], factors: Sequence[float]) -> tuple[np.ndarray, float]:
        return combine_arrays([np.asarray(t) for t in tensors], factors, sumsq=True)

    def accumulate(self, total: Tensor, tensor: Tensor, factor: float) -> np.ndarray:
        return accumulate_arrays(np.asarray(total), np.asarray(tensor), factor)

    def isotropic_exact(self, tensor: Tensor) -> tuple[np.ndarray, float]:
        return isotropic_exact_array(np.asarray(tensor))

    def isotropic_fast(self, tensor: Tensor, *, ns_steps: int, polish_steps: int, scale: str) -> tuple[np.ndarray, float]:
        return isotropic_fast_array(np.asarray(tensor), ns_steps=ns_steps, polish_steps=polish_steps, scale=scale)

    def outer_update(
        self,
        theta: Tensor,
        momentum: Tensor,
        delta: Tensor,
        *,
        lr: float,
        beta: float,
        delta_scale: float = 1.0,
        final: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        return outer_arrays(
            np.asarray(theta),
            np.asarray(momentum),
            np.asarray(delta),
            lr=lr,
            beta=beta,
            delta_scale=delta_scale,
            final=final,
        )

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
        return dtype_name_of(array) not in FLOAT_DTYPES or all_finite_array(array)

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

    def borrow_numpy(self, array: np.ndarray) -> np.ndarray:
        return array

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

    def add_in_place(self, model: Any, corrections: Mapping[str, np.ndarray]) -> None:
        live = dict(self.named_parameters(model))
        for name, correction in corrections.items():
            target = live[name]
            if target.dtype == np.float32:
                np.add(target, correction, out=target)
            else:
                target[...] = (target.astype(np.float32) + correction).astype(target.dtype)

    def new_host_buffer(self, live: Mapping[str, Tensor], names: Sequence[str]) -> HostBuffer:
        return HostBuffer({name: np.array(live[name], copy=True) for name in names})
