"""The small tensor interface the algorithms are written against, once for every framework.

A backend owns three things: the fp32 arithmetic a merge and an outer step need, reading
and writing a fragment's parameters in a model, and the conversion to NumPy arrays that
the shared Safetensors codec (:mod:`gradientmail.backends.payload`) builds on.

Fused kernels (issue 13). A round is bandwidth-bound: M deltas are read once to merge them
and the fragment once more for the outer step. The kernels below do each in one pass:

* :meth:`Backend.combine` / :meth:`Backend.combine_sumsq`: ``Σ fᵢ·tᵢ`` in fp32 (each term
  ``fp32(tᵢ)·fp32(fᵢ)`` rounded, then added in input order: the same per-element arithmetic
  as :meth:`Backend.linear_combination`), optionally with the fp64 sum of squares of the
  result accumulated in the same pass (RDA's ‖u‖).
* :meth:`Backend.accumulate`: one more term of such a sum, in place (a round summed as its
  contributions arrive is byte for byte the sum combined at once).
* :meth:`Backend.finite_norm`: the fp64-accumulated norm in one pass; a non-finite result
  means a NaN/Inf element (or an fp64 overflow), so it replaces ``all_finite`` + ``norm``.
* :meth:`Backend.outer_update`: the Nesterov step ``g = s·Δ; m' = β·m + g;
  θ' = θ − η(g + β·m')`` in one pass, writing new θ' and m' (never aliasing the inputs),
  with the merge's final scale ``s`` folded in.

Determinism: element-wise results do not depend on how the work is split. Reductions are
taken over fixed blocks of :data:`~gradientmail.backends.kernels.KERNEL_CHUNK` elements
(boundaries independent of the thread count), each block reduced by one thread, and the
per-block fp64 partial sums added in block order, so the same inputs give the same bytes
however many threads run. The generic implementations here compose the unfused operations;
backends override them (the NumPy and PyTorch ones with :mod:`gradientmail.backends.kernels`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from gradientmail.backends import payload
from gradientmail.backends.host import HostBuffer
from gradientmail.backends.kernels import isotropic_exact_array, isotropic_fast_array

Tensor = Any
"""A framework tensor: ``torch.Tensor``, ``mlx.core.array`` or ``numpy.ndarray``."""


class Backend(ABC):
    """Tensor operations for one framework. Arithmetic methods return fp32 tensors."""

    name: str
    reuses_host_buffers: bool = False
    """Whether a fragment's host snapshots are preallocated once and refilled from publish to
    publish (PyTorch, NumPy); otherwise each snapshot is a fresh copy (MLX)."""
    training_thread_only: bool = False
    """Whether the framework's tensors may be touched only by the thread that trains (MLX):
    a node's background work (the syncer's merges) then computes in NumPy."""

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

    # -- fused kernels (see the module docstring) ------------------------------------
    def combine(self, tensors: Sequence[Tensor], factors: Sequence[float]) -> Tensor:
        """``Σ factors[i]·tensors[i]`` in fp32 in one pass (same arithmetic as ``linear_combination``)."""
        return self.linear_combination(tensors, factors)

    def combine_sumsq(self, tensors: Sequence[Tensor], factors: Sequence[float]) -> tuple[Tensor, float]:
        """``combine`` and the fp64 sum of squares of its fp32 result, from the same pass."""
        combined = self.combine(tensors, factors)
        return combined, self.norm(combined) ** 2

    def accumulate(self, total: Tensor, tensor: Tensor, factor: float) -> Tensor:
        """``total + fp32(tensor)·fp32(factor)``: one more term of :meth:`combine` (the same
        bytes as combining every term at once), in place where the backend can; returns the
        sum. ``total`` must be an fp32 tensor this backend made (a ``combine`` result)."""
        return self.add(total, self.scale(self.to_fp32(tensor), factor))

    def finite_norm(self, tensor: Tensor) -> float:
        """The norm (fp64-accumulated) in one pass; NaN or infinite when any element is, or
        when the sum of squares overflows. Integer and bool tensors give their plain norm."""
        if not self.all_finite(tensor):
            return float("nan")
        return self.norm(tensor)

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
    ) -> tuple[Tensor, Tensor]:
        """One Nesterov outer step on one tensor: new fp32 ``(θ', m')``.

        ``g = fp32(delta_scale·Δ)`` (exactly ``delta`` when the scale is 1), ``m' = β·m + g``,
        ``θ' = θ − η·(g + β·m')``; ``final``: ``θ' = θ − g`` and ``m'`` is ``momentum`` itself.
        θ' is always a new tensor; so is m' unless ``final``.
        """
        grad = self.to_fp32(delta) if delta_scale == 1.0 else self.scale(delta, delta_scale)
        if final:
            return self.sub(theta, grad), momentum
        new_momentum = self.add(self.scale(momentum, beta), grad)
        update = self.scale(self.add(grad, self.scale(new_momentum, beta)), lr)
        return self.sub(theta, update), new_momentum

    # -- Iso-C (issue 14; see gm.IsoC and docs/algorithms.md) --------------------------
    def isotropic_exact(self, tensor: Tensor) -> tuple[Tensor, float]:
        """Exact Iso-C of a tensor of ≥ 2 dims (viewed as ``(shape[0], -1)``): ``(D, s)`` with
        ``D = U_r·V_rᵀ`` (fp32, the tensor's shape) and ``s`` the mean of its r non-zero singular
        values, so the isotropic tensor is ``s·D``. Computed in float64 through LAPACK's SVD;
        singular values at or below ``sigma_max·max(m, n)·ε_fp32`` count as zero. Same input, same
        bytes (on one backend and machine); backends agree within 1e-5.

        The generic form goes through NumPy (the reference); backends override it.
        """
        direction, factor = isotropic_exact_array(self.to_numpy(self.to_fp32(tensor)))
        return self.from_numpy(direction), factor

    def isotropic_fast(self, tensor: Tensor, *, ns_steps: int, polish_steps: int, scale: str) -> tuple[Tensor, float]:
        """Fast Iso-C: ``(O, s)`` with ``O ≈ U·Vᵀ`` from ``ns_steps`` quintic and ``polish_steps``
        cubic Newton–Schulz steps in fp32, and ``s`` the mean-singular-value estimate ``scale``
        names (``"mean"``: ⟨O, Δ⟩/‖O‖²; ``"rms"``: ‖Δ‖_F/√min(m, n)). See
        :func:`gradientmail.backends.kernels.isotropic_fast_array`."""
        ortho, factor = isotropic_fast_array(
            self.to_numpy(self.to_fp32(tensor)), ns_steps=ns_steps, polish_steps=polish_steps, scale=scale
        )
        return self.from_numpy(ortho), factor

    # -- NumPy bridge (the Safetensors codec is written once on top of it) ---------
    @abstractmethod
    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        """A host NumPy array; bf16 and fp8 use ``ml_dtypes`` dtypes."""

    @abstractmethod
    def from_numpy(self, array: np.ndarray) -> Tensor:
        """A framework tensor holding the array's values and dtype (its own, writable memory)."""

    def borrow_numpy(self, array: np.ndarray) -> Tensor:
        """Like ``from_numpy``, but sharing the array's memory where the framework can (a
        read-only view from :func:`payload.decode` stays one buffer). The caller must never
        write the result. Frameworks that cannot share copy."""
        return self.from_numpy(array)

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

    def add_in_place(self, model: Any, corrections: Mapping[str, np.ndarray]) -> None:
        """θ += correction for each named parameter (fp32 arithmetic, the parameter's dtype):
        how alignment carries unmerged work onto a commit without a copy of the fragment."""
        live = dict(self.named_parameters(model))
        self.write_parameters(model, {name: self.add(live[name], self.from_numpy(c)) for name, c in corrections.items()})

    # -- host snapshots (see gradientmail.backends.host) ------------------------------
    def new_host_buffer(self, live: Mapping[str, Tensor], names: Sequence[str]) -> HostBuffer:
        """A host snapshot of ``names``, filled (the generic form: a fresh copy of each)."""
        return HostBuffer({name: self.to_numpy(self.copy(live[name])) for name in names})

    def fill_host_buffer(self, buffer: HostBuffer, live: Mapping[str, Tensor], names: Sequence[str]) -> None:
        """Copy the live parameters into a reusable buffer (no allocation)."""
        for name in names:
            np.copyto(buffer.arrays[name], np.asarray(self.to_numpy(live[name])))

    @abstractmethod
    def copy(self, tensor: Tensor) -> Tensor:
        """A detached copy in the tensor's own dtype."""
