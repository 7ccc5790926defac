"""The small tensor interface the algorithms are written against, once for every framework.

A backend owns three things: the fp32 arithmetic a merge and an outer step need, reading
and writing a fragment's parameters in a model, and the conversion to NumPy arrays that
the shared Safetensors codec (:mod:`gradientmail.backends.payload`) builds on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from gradientmail.backends import payload

Tensor = Any
"""A framework tensor: ``torch.Tensor``, ``mlx.core.array`` or ``numpy.ndarray``."""


class Backend(ABC):
    """Tensor operations for one framework. Arithmetic methods return fp32 tensors."""

    name: str

    # -- recognising the framework -------------------------------------------------
    @abstractmethod
    def owns(self, obj: object) -> bool:
        """Whether ``obj`` (a tensor or a model) belongs to this framework."""

    # -- fp32 arithmetic -----------------------------------------------------------
    @abstractmethod
    def to_fp32(self, tensor: Tensor) -> Tensor:
        """The tensor as fp32 (a copy where the dtype differs)."""

    @abstractmethod
    def norm(self, tensor: Tensor) -> float:
        """Euclidean norm over all elements as a Python float.

        The elements are fp32 values; the sum of squares accumulates in float64 so that
        frameworks with different reduction orders agree far inside 1e-6.
        """

    @abstractmethod
    def scale(self, tensor: Tensor, factor: float) -> Tensor:
        """``factor * tensor`` in fp32."""

    @abstractmethod
    def add(self, a: Tensor, b: Tensor) -> Tensor:
        """``a + b`` in fp32."""

    @abstractmethod
    def sub(self, a: Tensor, b: Tensor) -> Tensor:
        """``a - b`` in fp32."""

    @abstractmethod
    def zeros_like(self, tensor: Tensor) -> Tensor:
        """fp32 zeros of the tensor's shape."""

    @abstractmethod
    def all_finite(self, tensor: Tensor) -> bool:
        """False if any element is NaN or infinite."""

    @abstractmethod
    def cast(self, tensor: Tensor, dtype: str) -> Tensor:
        """The tensor converted to the canonical dtype name (``"bfloat16"``, …)."""

    @abstractmethod
    def dtype_name(self, tensor: Tensor) -> str:
        """Canonical dtype name, shared by every backend (NumPy spelling)."""

    @abstractmethod
    def shape(self, tensor: Tensor) -> tuple[int, ...]:
        """The tensor's shape as a tuple of ints."""

    def linear_combination(self, tensors: Sequence[Tensor], factors: Sequence[float]) -> Tensor:
        """``Σ factors[i] * tensors[i]`` in fp32, summed in the given order (deterministic)."""
        if not tensors or len(tensors) != len(factors):
            raise ValueError("linear_combination needs as many factors as tensors, at least one")
        total = self.scale(self.to_fp32(tensors[0]), factors[0])
        for tensor, factor in zip(tensors[1:], factors[1:], strict=True):
            total = self.add(total, self.scale(self.to_fp32(tensor), factor))
        return total

    # -- NumPy bridge (the Safetensors codec is written once on top of it) ---------
    @abstractmethod
    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        """A host NumPy array; bf16 and fp8 use ``ml_dtypes`` dtypes."""

    @abstractmethod
    def from_numpy(self, array: np.ndarray) -> Tensor:
        """A framework tensor holding the array's values and dtype."""

    def encode(self, tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
        """Safetensors bytes for the named tensors."""
        return payload.encode({name: self.to_numpy(t) for name, t in tensors.items()}, metadata)

    def decode(self, data: bytes) -> tuple[dict[str, Tensor], dict[str, str]]:
        """Named tensors and metadata from Safetensors bytes; raises ``CorruptPayload``."""
        arrays, metadata = payload.decode(data)
        return {name: self.from_numpy(a) for name, a in arrays.items()}, metadata

    # -- models --------------------------------------------------------------------
    @abstractmethod
    def named_parameters(self, model: Any) -> list[tuple[str, Tensor]]:
        """Every parameter of the model in model order, as live references."""

    def read_parameters(self, model: Any, names: Iterable[str]) -> dict[str, Tensor]:
        """Detached copies of the named parameters (the anchor or the local values)."""
        wanted = list(names)
        live = dict(self.named_parameters(model))
        missing = [n for n in wanted if n not in live]
        if missing:
            raise KeyError(f"model has no parameter(s) {missing}")
        return {name: self.copy(live[name]) for name in wanted}

    @abstractmethod
    def write_parameters(self, model: Any, values: Mapping[str, Tensor]) -> None:
        """Overwrite the named parameters in place, casting to each parameter's dtype."""

    @abstractmethod
    def copy(self, tensor: Tensor) -> Tensor:
        """A detached copy in the tensor's own dtype."""
