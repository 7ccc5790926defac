"""MLX backend: models are ``mlx.nn.Module``s (parameters flattened with dotted names).

The fused kernels (see :mod:`gradientmail.backends.base`) build MLX's lazy graph with the
same per-element arithmetic as the other backends and evaluate it once, which lets MLX fuse
the element-wise work into one pass; norms accumulate in float64 on the CPU stream.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import ml_dtypes
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from gradientmail.backends.base import Backend, Tensor
from gradientmail.backends.kernels import CUBIC, QUINTIC, as_matrix
from gradientmail.backends.payload import dtype_name_of

_MLX_DTYPES: dict[str, mx.Dtype] = {
    "float64": mx.float64,
    "float32": mx.float32,
    "float16": mx.float16,
    "bfloat16": mx.bfloat16,
    "int64": mx.int64,
    "int32": mx.int32,
    "int16": mx.int16,
    "int8": mx.int8,
    "uint64": mx.uint64,
    "uint32": mx.uint32,
    "uint16": mx.uint16,
    "uint8": mx.uint8,
    "bool": mx.bool_,
}
_NAMES = {dtype: name for name, dtype in _MLX_DTYPES.items()}
_BF16 = np.dtype(ml_dtypes.bfloat16)


class MlxBackend(Backend):
    name = "mlx"
    training_thread_only = True

    def owns(self, obj: object) -> bool:
        return isinstance(obj, (mx.array, nn.Module))

    def to_fp32(self, tensor: mx.array) -> mx.array:
        return mx.array(tensor, dtype=mx.float32)

    def norm(self, tensor: mx.array) -> float:
        # float64 exists on MLX's CPU stream only; unified memory makes that copy-free on a Mac
        flat = tensor.reshape(-1).astype(mx.float64, stream=mx.cpu)
        root = mx.sqrt(mx.sum(flat * flat, stream=mx.cpu), stream=mx.cpu)
        return float(cast(float, root.item()))  # item() is typed int | float | complex; a float64 root is a float

    def finite_norm(self, tensor: mx.array) -> float:
        return self.norm(tensor)  # the float64 sum of squares carries any NaN/inf through

    def combine(self, tensors: Sequence[mx.array], factors: Sequence[float]) -> mx.array:
        combined: mx.array = self.linear_combination(tensors, factors)  # lazy: one graph, evaluated once
        mx.eval(combined)
        return combined

    # isotropic_exact: the generic NumPy/LAPACK form (MLX's SVD runs on the CPU stream in fp32
    # only; through NumPy it is float64 and the bytes equal the NumPy backend's).

    def isotropic_fast(self, tensor: mx.array, *, ns_steps: int, polish_steps: int, scale: str) -> tuple[mx.array, float]:
        # fp32 matrix products on MLX's default device (the GPU on Apple silicon)
        shape = tuple(int(d) for d in tensor.shape)
        rows, cols = as_matrix(shape)
        delta = tensor.astype(mx.float32).reshape(rows, cols)
        norm = self.norm(delta)
        if delta.size == 0 or norm == 0.0:
            return mx.zeros(shape, dtype=mx.float32), 0.0
        x = delta.T if rows > cols else delta
        x = x * (1.0 / norm)
        a, b, c = QUINTIC
        for _ in range(ns_steps):
            gram = x @ x.T
            x = a * x + (b * gram + c * (gram @ gram)) @ x
        a, b = CUBIC
        for _ in range(polish_steps):
            x = a * x + b * ((x @ x.T) @ x)
        ortho = (x.T if rows > cols else x).reshape(shape)
        mx.eval(ortho)
        if scale == "rms":
            factor = norm / math.sqrt(min(rows, cols))
        else:
            wide = ortho.reshape(-1).astype(mx.float64, stream=mx.cpu)
            flat = delta.reshape(-1).astype(mx.float64, stream=mx.cpu)
            energy = float(cast(float, mx.sum(wide * wide, stream=mx.cpu).item()))
            inner = float(cast(float, mx.sum(wide * flat, stream=mx.cpu).item()))
            factor = inner / energy if energy > 0.0 else 0.0
        return ortho, factor

    def outer_update(
        self,
        theta: mx.array,
        momentum: mx.array,
        delta: mx.array,
        *,
        lr: float,
        beta: float,
        delta_scale: float = 1.0,
        final: bool = False,
    ) -> tuple[mx.array, mx.array]:
        new_theta, new_momentum = super().outer_update(
            theta, momentum, delta, lr=lr, beta=beta, delta_scale=delta_scale, final=final
        )
        mx.eval(new_theta, new_momentum)
        return new_theta, new_momentum

    def scale(self, tensor: mx.array, factor: float) -> mx.array:
        return tensor.astype(mx.float32) * factor

    def add(self, a: mx.array, b: mx.array) -> mx.array:
        return a.astype(mx.float32) + b.astype(mx.float32)

    def sub(self, a: mx.array, b: mx.array) -> mx.array:
        return a.astype(mx.float32) - b.astype(mx.float32)

    def zeros_like(self, tensor: mx.array) -> mx.array:
        return mx.zeros(tensor.shape, dtype=mx.float32)

    def all_finite(self, tensor: mx.array) -> bool:
        if not mx.issubdtype(tensor.dtype, mx.floating):
            return True
        return bool(mx.all(mx.isfinite(tensor.astype(mx.float32))).item())

    def cast(self, tensor: mx.array, dtype: str) -> mx.array:
        return tensor.astype(self.mlx_dtype(dtype))

    def dtype_name(self, tensor: mx.array) -> str:
        try:
            return _NAMES[tensor.dtype]
        except KeyError:
            raise TypeError(f"dtype {tensor.dtype} is not supported") from None

    def shape(self, tensor: mx.array) -> tuple[int, ...]:
        return tuple(int(d) for d in tensor.shape)

    @staticmethod
    def mlx_dtype(name: str) -> mx.Dtype:
        try:
            return _MLX_DTYPES[name]
        except KeyError:
            raise TypeError(f"MLX has no dtype {name!r}; known: {sorted(_MLX_DTYPES)}") from None

    def to_numpy(self, tensor: mx.array) -> np.ndarray:
        if tensor.dtype == mx.bfloat16:  # NumPy's buffer protocol has no bf16: move the bits
            return np.array(tensor.view(mx.uint16)).view(_BF16)
        return np.array(tensor)

    def from_numpy(self, array: np.ndarray) -> mx.array:
        name = dtype_name_of(array)  # refuses dtypes no payload can carry
        if name == "bfloat16":
            return mx.array(np.ascontiguousarray(array).view(np.uint16)).view(mx.bfloat16)
        return mx.array(array, dtype=self.mlx_dtype(name))  # mx.array alone narrows float64

    def copy(self, tensor: mx.array) -> mx.array:
        return mx.array(tensor)

    def named_parameters(self, model: Any) -> list[tuple[str, Tensor]]:
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected an mlx.nn.Module, got {type(model).__name__}")
        parameters = model.parameters()  # type: ignore[no-untyped-call]  # mlx leaves Module.parameters unannotated
        # tree_flatten returns a dict only when given a dict destination
        return cast(list[tuple[str, mx.array]], tree_flatten(parameters))

    def write_parameters(self, model: Any, values: Mapping[str, mx.array]) -> None:
        live = dict(self.named_parameters(model))
        updates = [(name, value.astype(live[name].dtype)) for name, value in values.items()]
        model.update(tree_unflatten(updates))
        mx.eval(model.parameters())
