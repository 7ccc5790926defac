"""PyTorch backend: models are ``torch.nn.Module``s; tensors may live on any device.

Tensors decoded from the mailbox are host (CPU) tensors, while a learner's parameters may
live on a GPU: arithmetic on two tensors on different devices runs on the accelerator's,
NumPy conversion always goes through host memory, and writing a parameter moves the value
to that parameter's device and dtype. MPS has no float64, so norms of MPS tensors are
taken on the host.

The fused kernels (``combine``, ``finite_norm``, ``outer_update``; see
:mod:`gradientmail.backends.base`) run on host tensors through zero-copy NumPy views with
the NumPy backend's blocked, threaded kernels: the syncer's tensors are host tensors, and the
two backends then give the same bytes and never depend on torch's thread count. Tensors on
an accelerator take the generic composition of torch ops (bandwidth-bound there anyway).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch

from gradientmail.backends.base import Backend, Tensor
from gradientmail.backends.host import HostBuffer
from gradientmail.backends.kernels import (
    CUBIC,
    QUINTIC,
    accumulate_arrays,
    all_finite_array,
    as_matrix,
    combine_arrays,
    finite_norm_array,
    isotropic_exact_array,
    isotropic_fast_array,
    outer_arrays,
    rank_tolerance,
)
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


def _host_view(tensor: torch.Tensor) -> np.ndarray | None:
    """A zero-copy NumPy view of a host tensor (bf16/fp8 through their bits); None elsewhere."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu" or tensor.dtype not in _NAMES:
        return None
    if tensor.dtype in _BIT_VIEWS:
        int_dtype, np_dtype = _BIT_VIEWS[tensor.dtype]
        return tensor.view(int_dtype).numpy().view(np_dtype)
    return tensor.numpy()


def _host_views(tensors: Sequence[torch.Tensor]) -> list[np.ndarray] | None:
    views = [_host_view(t) for t in tensors]
    return None if any(v is None for v in views) else [v for v in views if v is not None]


def _share(array: np.ndarray) -> torch.Tensor:
    """A tensor over a C-contiguous array's memory (bf16/fp8 through a same-width int view)."""
    if array.dtype in _FROM_NUMPY_VIEWS:
        int_dtype, torch_dtype = _FROM_NUMPY_VIEWS[array.dtype]
        int_np = np.dtype(np.int16) if int_dtype == torch.int16 else np.dtype(np.int8)
        return torch.from_numpy(array.view(int_np)).view(torch_dtype)
    return torch.from_numpy(array)


def _float64_device(tensor: torch.Tensor) -> torch.device:
    """Where float64 work on ``tensor`` runs: its own device, the host for MPS (no float64)."""
    return tensor.device if tensor.device.type != "mps" else torch.device("cpu")


def isotropic_exact_tensor(tensor: torch.Tensor) -> tuple[torch.Tensor, float]:
    """:meth:`Backend.isotropic_exact` in torch ops: ``torch.linalg.svd`` in float64 on the
    tensor's device (the host for MPS). What accelerator tensors take."""
    source = tensor.detach()
    shape = tuple(int(d) for d in source.shape)
    rows, cols = as_matrix(shape)
    matrix = source.to(device=_float64_device(source), dtype=torch.float32).to(torch.float64).reshape(rows, cols)
    if matrix.numel() == 0:
        return torch.zeros(shape, dtype=torch.float32, device=source.device), 0.0
    left, sigma, right = torch.linalg.svd(matrix, full_matrices=False)
    rank = int(torch.count_nonzero(sigma > rank_tolerance((rows, cols), float(sigma[0]))))
    if rank == 0:
        return torch.zeros(shape, dtype=torch.float32, device=source.device), 0.0
    direction = (left[:, :rank] @ right[:rank]).to(torch.float32).reshape(shape)
    return direction.to(source.device), float(sigma[:rank].mean())


def isotropic_fast_tensor(tensor: torch.Tensor, *, ns_steps: int, polish_steps: int, scale: str) -> tuple[torch.Tensor, float]:
    """:meth:`Backend.isotropic_fast` in torch ops: fp32 matrix products on the tensor's own
    device (the point of the fast form on a GPU), sums in float64. What accelerator tensors take."""
    shape = tuple(int(d) for d in tensor.shape)
    rows, cols = as_matrix(shape)
    delta = tensor.detach().to(torch.float32).reshape(rows, cols)
    wide_delta = delta.to(_float64_device(delta), torch.float64)
    norm = float(torch.linalg.vector_norm(wide_delta)) if delta.numel() else 0.0
    if norm == 0.0:
        return torch.zeros(shape, dtype=torch.float32, device=tensor.device), 0.0
    x = delta.T if rows > cols else delta
    x = x * (1.0 / norm)
    a, b, c = QUINTIC
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    a, b = CUBIC
    for _ in range(polish_steps):
        x = a * x + b * ((x @ x.T) @ x)
    ortho = (x.T if rows > cols else x).contiguous()
    if scale == "rms":
        factor = norm / math.sqrt(min(rows, cols))
    else:
        wide = ortho.to(wide_delta.device, torch.float64)
        energy = float((wide * wide).sum())
        factor = float((wide * wide_delta).sum()) / energy if energy > 0.0 else 0.0
    return ortho.reshape(shape), factor


class TorchBackend(Backend):
    name = "torch"
    reuses_host_buffers = True

    def owns(self, obj: object) -> bool:
        return isinstance(obj, (torch.Tensor, torch.nn.Module))

    def to_fp32(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(torch.float32, copy=True)

    def norm(self, tensor: torch.Tensor) -> float:
        host = _host_view(tensor)
        if host is not None:
            return finite_norm_array(host)
        tensor = tensor.detach()
        if tensor.device.type == "mps":  # MPS has no float64 to accumulate in
            tensor = tensor.cpu()
        return float(torch.linalg.vector_norm(tensor, dtype=torch.float64))

    def scale(self, tensor: torch.Tensor, factor: float) -> torch.Tensor:
        host = _host_view(tensor)
        if host is not None and host.dtype == np.float32:  # same product, NumPy's faster host loop
            return torch.from_numpy(np.multiply(host, np.float32(factor), out=np.empty(host.shape, np.float32)))
        return tensor.detach().to(torch.float32) * factor

    def add(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = _on_one_device(a.detach(), b.detach())
        return a.to(torch.float32) + b.to(torch.float32)

    def sub(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = _on_one_device(a.detach(), b.detach())
        return a.to(torch.float32) - b.to(torch.float32)

    def finite_norm(self, tensor: torch.Tensor) -> float:
        return self.norm(tensor)  # the fp64 sum of squares carries any NaN/inf through

    def combine(self, tensors: Sequence[torch.Tensor], factors: Sequence[float]) -> torch.Tensor:
        views = _host_views(tensors)
        if views is None:
            combined: torch.Tensor = super().combine(tensors, factors)
            return combined
        return torch.from_numpy(combine_arrays(views, factors)[0])

    def combine_sumsq(self, tensors: Sequence[torch.Tensor], factors: Sequence[float]) -> tuple[torch.Tensor, float]:
        views = _host_views(tensors)
        if views is None:
            return super().combine_sumsq(tensors, factors)
        combined, sumsq = combine_arrays(views, factors, sumsq=True)
        return torch.from_numpy(combined), sumsq

    def accumulate(self, total: torch.Tensor, tensor: torch.Tensor, factor: float) -> torch.Tensor:
        views = _host_views([total, tensor])
        if views is None:
            summed: torch.Tensor = super().accumulate(total, tensor, factor)
            return summed
        accumulate_arrays(views[0], views[1], factor)  # in place: ``total`` shares the view's memory
        return total

    def isotropic_exact(self, tensor: torch.Tensor) -> tuple[torch.Tensor, float]:
        host = _host_view(tensor)
        if host is not None:  # host tensors: the NumPy kernel, same bytes as the NumPy backend
            direction, factor = isotropic_exact_array(host)
            return torch.from_numpy(direction), factor
        return isotropic_exact_tensor(tensor)

    def isotropic_fast(self, tensor: torch.Tensor, *, ns_steps: int, polish_steps: int, scale: str) -> tuple[torch.Tensor, float]:
        host = _host_view(tensor)
        if host is not None:  # NumPy's OpenBLAS gave the same bytes on 1 and 2 threads; torch's MKL did not
            ortho, factor = isotropic_fast_array(host, ns_steps=ns_steps, polish_steps=polish_steps, scale=scale)
            return torch.from_numpy(ortho), factor
        return isotropic_fast_tensor(tensor, ns_steps=ns_steps, polish_steps=polish_steps, scale=scale)

    def outer_update(
        self,
        theta: torch.Tensor,
        momentum: torch.Tensor,
        delta: torch.Tensor,
        *,
        lr: float,
        beta: float,
        delta_scale: float = 1.0,
        final: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        views = _host_views([theta, momentum, delta])
        if views is None:
            return super().outer_update(theta, momentum, delta, lr=lr, beta=beta, delta_scale=delta_scale, final=final)
        new_theta, new_momentum = outer_arrays(*views, lr=lr, beta=beta, delta_scale=delta_scale, final=final)
        return torch.from_numpy(new_theta), momentum if final else torch.from_numpy(new_momentum)

    def zeros_like(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(tensor, dtype=torch.float32)

    def all_finite(self, tensor: torch.Tensor) -> bool:
        if not (tensor.is_floating_point() or tensor.is_complex()):
            return True
        host = _host_view(tensor)
        if host is not None:  # host tensors: the blocked kernel, no mask the tensor's size
            return all_finite_array(host)
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
        array = np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray makes 0-d arrays 1-d
        if not array.flags.writeable:
            array = array.copy()
        return _share(array)

    def borrow_numpy(self, array: np.ndarray) -> torch.Tensor:
        dtype_name_of(array)
        array = np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray makes 0-d arrays 1-d
        with warnings.catch_warnings():  # torch warns that a read-only buffer becomes a writable tensor
            warnings.simplefilter("ignore", UserWarning)
            return _share(array)

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

    def add_in_place(self, model: Any, corrections: Mapping[str, np.ndarray]) -> None:
        live = dict(self.named_parameters(model))
        with torch.no_grad():
            for name, correction in corrections.items():
                param = live[name]
                param.add_(torch.from_numpy(correction).to(param.device))

    def new_host_buffer(self, live: Mapping[str, Tensor], names: Sequence[str]) -> HostBuffer:
        """Preallocated CPU tensors sharing their memory with the buffer's arrays (pinned for
        accelerator parameters, so the copy overlaps), filled."""
        targets: dict[str, object] = {}
        arrays: dict[str, np.ndarray] = {}
        for name in names:
            param = live[name]
            target = torch.empty(param.shape, dtype=param.dtype, device="cpu", pin_memory=param.device.type == "cuda")
            targets[name], arrays[name] = target, self.to_numpy(target)  # shares the memory
        buffer = HostBuffer(arrays, targets)
        self.fill_host_buffer(buffer, live, names)
        return buffer

    def fill_host_buffer(self, buffer: HostBuffer, live: Mapping[str, Tensor], names: Sequence[str]) -> None:
        if not buffer.targets:
            super().fill_host_buffer(buffer, live, names)
            return
        with torch.no_grad():
            for name in names:
                target = buffer.targets[name]
                assert isinstance(target, torch.Tensor)
                target.copy_(live[name].detach())
