"""PyTorch backend: models are ``torch.nn.Module``s; tensors may live on any device.

Tensors decoded from the mailbox are host (CPU) tensors, while a learner's parameters may
live on a GPU: arithmetic on two tensors on different devices runs on the accelerator's,
NumPy conversion always goes through host memory, and writing a parameter moves the value
to that parameter's device and dtype. MPS has no float64, so norms of MPS tensors are
taken on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import torch

from gradientmail.backends.base import Backend, Tensor
from gradientmail.backends.payload import dtype_name_of

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint64": torch.uint64,
    "uint32": torch.uint32,
    "uint16": torch.uint16,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {dtype: name for name, dtype in _TORCH_DTYPES.items()}
# dtypes NumPy lacks natively: move their bits through a same-width integer view
_BIT_VIEWS: dict[torch.dtype, tuple[torch.dtype, np.dtype]] = {
    torch.bfloat16: (torch.int16, np.dtype(ml_dtypes.bfloat16)),
    torch.float8_e4m3fn: (torch.int8, np.dtype(ml_dtypes.float8_e4m3fn)),
    torch.float8_e5m2: (torch.int8, np.dtype(ml_dtypes.float8_e5m2)),
}
_FROM_NUMPY_VIEWS = {np_dtype: (int_dtype, t_dtype) for t_dtype, (int_dtype, np_dtype) in _BIT_VIEWS.items()}


def _on_one_device(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both operands on one device: unchanged when they share one, else on the one that is not
    the CPU (a learner's host anchor against its live GPU parameters computes on the GPU)."""
    if a.device == b.device:
        return a, b
    device = b.device if a.device.type == "cpu" else a.device
    return a.to(device), b.to(device)


class TorchBackend(Backend):
    name = "torch"

    def owns(self, obj: object) -> bool:
        return isinstance(obj, (torch.Tensor, torch.nn.Module))

    def to_fp32(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(torch.float32, copy=True)

    def norm(self, tensor: torch.Tensor) -> float:
        tensor = tensor.detach()
        if tensor.device.type == "mps":  # MPS has no float64 to accumulate in
            tensor = tensor.cpu()
        return float(torch.linalg.vector_norm(tensor, dtype=torch.float64))

    def scale(self, tensor: torch.Tensor, factor: float) -> torch.Tensor:
        return tensor.detach().to(torch.float32) * factor

    def add(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = _on_one_device(a.detach(), b.detach())
        return a.to(torch.float32) + b.to(torch.float32)

    def sub(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = _on_one_device(a.detach(), b.detach())
        return a.to(torch.float32) - b.to(torch.float32)

    def zeros_like(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(tensor, dtype=torch.float32)

    def all_finite(self, tensor: torch.Tensor) -> bool:
        if not (tensor.is_floating_point() or tensor.is_complex()):
            return True
        return bool(torch.isfinite(tensor.detach().to(torch.float32)).all())

    def cast(self, tensor: torch.Tensor, dtype: str) -> torch.Tensor:
        return tensor.detach().to(self.torch_dtype(dtype))

    def dtype_name(self, tensor: torch.Tensor) -> str:
        try:
            return _NAMES[tensor.dtype]
        except KeyError:
            raise TypeError(f"dtype {tensor.dtype} is not supported") from None

    def shape(self, tensor: torch.Tensor) -> tuple[int, ...]:
        return tuple(int(d) for d in tensor.shape)

    @staticmethod
    def torch_dtype(name: str) -> torch.dtype:
        try:
            return _TORCH_DTYPES[name]
        except KeyError:
            raise TypeError(f"unknown dtype {name!r}; known: {sorted(_TORCH_DTYPES)}") from None

    def to_numpy(self, tensor: torch.Tensor) -> np.ndarray:
        host = tensor.detach().cpu().contiguous()
        if host.dtype in _BIT_VIEWS:
            int_dtype, np_dtype = _BIT_VIEWS[host.dtype]
            return host.view(int_dtype).numpy().view(np_dtype)
        return host.numpy()

    def from_numpy(self, array: np.ndarray) -> torch.Tensor:
        dtype_name_of(array)  # refuse dtypes no payload can carry
        array = np.ascontiguousarray(array)
        if not array.flags.writeable:
            array = array.copy()
        if array.dtype in _FROM_NUMPY_VIEWS:
            int_dtype, torch_dtype = _FROM_NUMPY_VIEWS[array.dtype]
            int_np = np.dtype(np.int16) if int_dtype == torch.int16 else np.dtype(np.int8)
            return torch.from_numpy(array.view(int_np)).view(torch_dtype)
        return torch.from_numpy(array)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().clone()

    def named_parameters(self, model: Any) -> list[tuple[str, Tensor]]:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
        return list(model.named_parameters())

    def write_parameters(self, model: Any, values: Mapping[str, torch.Tensor]) -> None:
        live = dict(self.named_parameters(model))
        with torch.no_grad():
            for name, value in values.items():
                target = live[name]
                target.copy_(value.to(device=target.device, dtype=target.dtype))
