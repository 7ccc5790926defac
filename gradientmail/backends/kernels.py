"""The shared NumPy kernels: fused merge, norm, finiteness and outer-step passes, and Iso-C, on host arrays.

Written once here and used by the NumPy backend, by the PyTorch backend for host tensors
(zero-copy views, so both give the same bytes), by :mod:`gradientmail.backends.quantize`, and by
:class:`~gradientmail.backends.base.Backend`'s generic Iso-C. They live in a module of their own,
which imports no other backend module, so that ``base`` and the backends can all import them
without importing each other in a circle.

Each kernel walks fixed blocks of :data:`KERNEL_CHUNK` elements: a block's output and one or two
fp32 scratch blocks stay in cache while the inputs stream through once. NumPy releases the GIL
inside ufuncs, so a small thread pool takes contiguous runs of blocks (each block computed by one
thread); reductions come back per block and are added in block order, so the thread count never
changes a result. ``GRADIENTMAIL_KERNEL_THREADS`` (or :func:`set_kernel_threads`) bounds the pool;
the default is the cores this process may use (``gradientmail/cores.py``: its affinity capped
by its cgroup's CPU quota), at most 8.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gradientmail.cores import available_cores

KERNEL_CHUNK = 1 << 18
"""Elements per block of the fused kernels (1 MiB of fp32): fixed, so reductions summed per
block in block order give the same bytes on any thread count. Big enough that per-call
overhead vanishes, small enough that a block's fp32 scratch stays in L2/L3."""

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_NATIVE_FLOATS = (np.dtype(np.float16), _F32, _F64)


class Scratch:
    """One thread's scratch blocks: two fp32, one fp64 (for the fp64 sums of squares) and one
    bool (for finiteness). Kept per thread and reused, so a call on a small tensor pays no
    allocation or page faults."""

    def __init__(self) -> None:
        self.f32 = np.empty(KERNEL_CHUNK, _F32)
        self.f32b = np.empty(KERNEL_CHUNK, _F32)
        self.f64 = np.empty(KERNEL_CHUNK, _F64)
        self.flags = np.empty(KERNEL_CHUNK, np.bool_)


Block = Callable[[int, int, Scratch], float]
"""Work on elements ``[start, stop)`` with a thread's scratch; returns the block's partial sum."""


def _default_threads() -> int:
    configured = os.environ.get("GRADIENTMAIL_KERNEL_THREADS", "")
    if configured.strip().isdigit() and int(configured) > 0:
        return int(configured)
    return min(available_cores(), 8)


_threads = _default_threads()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()
_local = threading.local()


def _forget_pool() -> None:
    """In a forked child the parent's pool threads do not exist: start a fresh pool on demand."""
    global _pool, _pool_size, _pool_lock
    _pool, _pool_size, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _thread_scratch() -> Scratch:
    scratch: Scratch | None = getattr(_local, "scratch", None)
    if scratch is None:
        scratch = _local.scratch = Scratch()
    return scratch


def set_kernel_threads(count: int | None) -> int:
    """Use ``count`` threads in the kernels (None: the default); returns the previous count.
    Results do not depend on it (fixed blocks, per-block reductions summed in order)."""
    global _threads
    previous = _threads
    _threads = _default_threads() if count is None else max(1, int(count))
    return previous


def kernel_threads() -> int:
    """How many threads the kernels use."""
    return _threads


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < workers:  # an outgrown pool's threads end once unreferenced
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gm-kernel")
            _pool_size = workers
        return _pool


def run_blocks(size: int, work: Block) -> list[float]:
    """``work`` over every block of ``[0, size)``; the partial sums in block order."""
    starts = range(0, size, KERNEL_CHUNK)
    count = len(starts)
    workers = min(_threads, count)

    def run(first: int, last: int) -> list[float]:
        scratch = _thread_scratch()
        return [work(starts[i], min(starts[i] + KERNEL_CHUNK, size), scratch) for i in range(first, last)]

    if workers <= 1:
        return run(0, count)
    bounds = [count * w // workers for w in range(workers + 1)]
    pool = _executor(workers - 1)
    futures = [pool.submit(run, bounds[w], bounds[w + 1]) for w in range(1, workers)]
    partials = run(bounds[0], bounds[1])  # the calling thread takes the first run of blocks
    for future in futures:
        partials.extend(future.result())
    return partials


def _flat(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1)


def _to_fp32_into(out: np.ndarray, source: np.ndarray) -> np.ndarray:
    """``source`` as fp32: itself when it already is, else converted into ``out``."""
    if source.dtype == _F32:
        return source
    np.copyto(out, source, casting="unsafe")
    return out


def _sumsq(block: np.ndarray, scratch: Scratch) -> float:
    """fp64 sum of squares of a block: widen into fp64 scratch, square in place, NumPy's
    pairwise sum. Deterministic (no BLAS, whose threads and order vary) and the fastest form
    measured: a reduction that casts on the fly, or einsum, runs 2-4× slower."""
    wide = scratch.f64[: block.size]
    np.copyto(wide, block, casting="unsafe")
    with np.errstate(over="ignore", invalid="ignore"):  # a non-finite sum is an answer here
        np.multiply(wide, wide, out=wide)
        return float(np.add.reduce(wide))


def combine_arrays(arrays: Sequence[np.ndarray], factors: Sequence[float], *, sumsq: bool = False) -> tuple[np.ndarray, float]:
    """``Σ fᵢ·aᵢ`` in fp32 (each term ``fp32(aᵢ)·fp32(fᵢ)``, added in order) and, if asked,
    the fp64 sum of squares of the result; one pass over the inputs."""
    if not arrays or len(arrays) != len(factors):
        raise ValueError("combine needs as many factors as tensors, at least one")
    shape = np.shape(arrays[0])
    for index, array in enumerate(arrays[1:], start=1):
        if np.shape(array) != shape:
            raise ValueError(f"tensor {index} has shape {np.shape(array)}, tensor 0 {shape}")
    flats = [_flat(np.asarray(a)) for a in arrays]
    scales = [np.float32(f) for f in factors]
    out = np.empty(flats[0].size, _F32)

    def work(start: int, stop: int, scratch: Scratch) -> float:
        block = out[start:stop]
        size = stop - start
        term = scratch.f32[:size]
        np.multiply(_to_fp32_into(block, flats[0][start:stop]), scales[0], out=block)
        for flat, scale in zip(flats[1:], scales[1:], strict=True):
            np.multiply(_to_fp32_into(term, flat[start:stop]), scale, out=term)
            np.add(block, term, out=block)
        return _sumsq(block, scratch) if sumsq else 0.0

    partials = run_blocks(out.size, work)
    return out.reshape(shape), sum(partials, 0.0)


def accumulate_arrays(total: np.ndarray, array: np.ndarray, factor: float) -> np.ndarray:
    """``total += fp32(array)·fp32(factor)`` in place, one pass, returning ``total`` (fp32,
    C-contiguous): the per-element arithmetic of one more term of :func:`combine_arrays`, so
    a sum built term by term is byte for byte the sum combined at once."""
    if total.dtype != _F32 or not total.flags.c_contiguous or not total.flags.writeable:
        raise ValueError("the running sum must be a writable, contiguous fp32 array")
    if np.shape(array) != np.shape(total):
        raise ValueError(f"term has shape {np.shape(array)}, the sum {np.shape(total)}")
    sums = total.reshape(-1)
    flat = _flat(np.asarray(array))
    scale = np.float32(factor)

    def work(start: int, stop: int, scratch: Scratch) -> float:
        term = scratch.f32[: stop - start]
        np.multiply(_to_fp32_into(term, flat[start:stop]), scale, out=term)
        np.add(sums[start:stop], term, out=sums[start:stop])
        return 0.0

    run_blocks(sums.size, work)
    return total


def finite_norm_array(array: np.ndarray) -> float:
    """fp64-accumulated norm in one pass over fixed blocks; NaN/inf when an element is."""
    flat = _flat(np.asarray(array))
    native = flat.dtype in _NATIVE_FLOATS or flat.dtype.kind in "biu"

    def work(start: int, stop: int, scratch: Scratch) -> float:
        block = flat[start:stop]
        if not native:  # bf16/fp8: exact in fp32 first (ml_dtypes casts to fp32 directly)
            block = _to_fp32_into(scratch.f32[: stop - start], block)
        return _sumsq(block, scratch)

    return math.sqrt(sum(run_blocks(flat.size, work), 0.0))


def all_finite_array(array: np.ndarray) -> bool:
    """False if any element is NaN or infinite (integers and bools: always True); one pass over
    fixed blocks into a per-thread flag block, so a 16 MB tensor allocates nothing (a whole-array
    ``isfinite`` writes a fresh mask of a quarter of its size first, and ran ~17x slower)."""
    flat = _flat(np.asarray(array))
    if flat.dtype.kind in "biu":
        return True
    native = flat.dtype in _NATIVE_FLOATS

    def work(start: int, stop: int, scratch: Scratch) -> float:
        block = flat[start:stop]
        if not native:  # bf16/fp8: exact in fp32 first
            block = _to_fp32_into(scratch.f32[: stop - start], block)
        flags = scratch.flags[: stop - start]
        np.isfinite(block, out=flags)
        return 0.0 if flags.all() else 1.0

    return not any(run_blocks(flat.size, work))


def outer_arrays(
    theta: np.ndarray,
    momentum: np.ndarray,
    delta: np.ndarray,
    *,
    lr: float,
    beta: float,
    delta_scale: float,
    final: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """The fused Nesterov step of :meth:`Backend.outer_update` on arrays: one pass, new θ' and m'."""
    shape = np.shape(theta)
    if np.shape(delta) != shape or np.shape(momentum) != shape:
        raise ValueError(f"outer step shapes differ: θ {shape}, m {np.shape(momentum)}, Δ {np.shape(delta)}")
    theta_flat, delta_flat = _flat(theta), _flat(delta)
    momentum_flat = _flat(momentum)
    if momentum_flat.dtype != _F32:
        momentum_flat = momentum_flat.astype(_F32)
    new_theta = np.empty(theta_flat.size, _F32)
    new_momentum = momentum if final else np.empty(theta_flat.size, _F32)
    new_momentum_flat = new_momentum.reshape(-1)
    scale, lr32, beta32 = np.float32(delta_scale), np.float32(lr), np.float32(beta)

    def work(start: int, stop: int, scratch: Scratch) -> float:
        size = stop - start
        grad = _to_fp32_into(scratch.f32[:size], delta_flat[start:stop])
        if delta_scale != 1.0:
            grad = np.multiply(grad, scale, out=scratch.f32[:size])
        out = new_theta[start:stop]
        current = _to_fp32_into(out, theta_flat[start:stop])
        if final:
            np.subtract(current, grad, out=out)
            return 0.0
        moment = new_momentum_flat[start:stop]
        np.multiply(momentum_flat[start:stop], beta32, out=moment)
        np.add(moment, grad, out=moment)
        update = scratch.f32b[:size]
        np.multiply(moment, beta32, out=update)
        np.add(grad, update, out=update)
        np.multiply(update, lr32, out=update)
        np.subtract(current, update, out=out)
        return 0.0

    run_blocks(theta_flat.size, work)
    return new_theta.reshape(shape), new_momentum if final else new_momentum.reshape(shape)


# -- Iso-C: the isotropic form of a matrix (issue 14) ------------------------------------------

QUINTIC = (3.4445, -4.7750, 2.0315)
"""Muon's Newton–Schulz coefficients: X ← aX + (b·A + c·A²)X with A = XXᵀ. They push every
singular value above ~1e-3 of the normalised matrix into [0.68, 1.2] in five steps, but do
not converge to 1 (so alone they are not U·Vᵀ)."""
CUBIC = (1.5, -0.5)
"""The classic Newton–Schulz step X ← 1.5X − 0.5·XXᵀX: quadratic convergence to exactly 1 for
singular values in (0, √3), so a few steps after the quintic ones polish [0.68, 1.2] to 1."""


def rank_tolerance(shape: tuple[int, int], largest: float) -> float:
    """Singular values at or below this are zero for Iso-C: ``sigma_max·max(m, n)·ε_fp32``, the
    numerical rank ``np.linalg.matrix_rank`` uses for fp32 input (the merged delta is fp32)."""
    return largest * max(shape) * float(np.finfo(np.float32).eps)


def as_matrix(shape: tuple[int, ...]) -> tuple[int, int]:
    """The matrix Iso-C sees for a tensor of ≥ 2 dims: ``(shape[0], prod(shape[1:]))``."""
    if len(shape) < 2:
        raise ValueError(f"Iso-C needs a tensor of at least 2 dims, got shape {shape}")
    return shape[0], math.prod(shape[1:])


def isotropic_exact_array(array: np.ndarray) -> tuple[np.ndarray, float]:
    """Exact Iso-C of a tensor as ``(U_r·V_rᵀ in fp32, mean sigma)``: the result is their product.

    The tensor (≥ 2 dims, viewed as ``(shape[0], -1)``) is taken to float64 and decomposed with
    LAPACK's SVD; the r singular values above :func:`rank_tolerance` are replaced by their
    mean, the rest stay zero (their singular vectors are arbitrary, so keeping them would add
    an update in an arbitrary direction). A zero matrix gives zeros and 0.
    """
    shape = tuple(int(d) for d in np.shape(array))
    rows, cols = as_matrix(shape)
    matrix = np.asarray(array, dtype=np.float64).reshape(rows, cols)
    if not matrix.size:
        return np.zeros(shape, _F32), 0.0
    left, sigma, right = np.linalg.svd(matrix, full_matrices=False)
    rank = int(np.count_nonzero(sigma > rank_tolerance((rows, cols), float(sigma[0]))))
    if rank == 0:
        return np.zeros(shape, _F32), 0.0
    direction = left[:, :rank] @ right[:rank]
    return direction.astype(_F32).reshape(shape), float(np.mean(sigma[:rank]))


def isotropic_fast_array(array: np.ndarray, *, ns_steps: int, polish_steps: int, scale: str) -> tuple[np.ndarray, float]:
    """Fast Iso-C as ``(O, s)``: O ≈ U·Vᵀ by Newton–Schulz in fp32, s ≈ the mean singular value.

    ``ns_steps`` quintic steps (:data:`QUINTIC`) then ``polish_steps`` cubic ones (:data:`CUBIC`),
    on the Frobenius-normalised matrix, iterating on its wide side (``XXᵀ`` is min(m, n)²).
    ``scale``: ``"mean"`` estimates mean sigma as ⟨O, Δ⟩/‖O‖² (exact when O = U_r·V_rᵀ: nuclear
    norm over rank); ``"rms"`` is the paper's proxy ‖Δ‖_F/√min(m, n), the RMS of the singular
    values, which exceeds their mean on any non-flat spectrum.
    """
    shape = tuple(int(d) for d in np.shape(array))
    rows, cols = as_matrix(shape)
    delta = np.asarray(array, dtype=_F32).reshape(rows, cols)
    norm = float(np.sqrt(np.sum(np.square(delta, dtype=np.float64))))
    if not delta.size or norm == 0.0:
        return np.zeros(shape, _F32), 0.0
    x = delta.T if rows > cols else delta
    x = x * np.float32(1.0 / norm)
    a, b, c = (np.float32(v) for v in QUINTIC)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    a, b = (np.float32(v) for v in CUBIC)
    for _ in range(polish_steps):
        x = a * x + b * ((x @ x.T) @ x)
    ortho = np.ascontiguousarray(x.T if rows > cols else x)
    if scale == "rms":
        factor = norm / math.sqrt(min(rows, cols))
    else:
        wide = ortho.astype(np.float64)
        energy = float(np.sum(wide * wide))
        factor = float(np.sum(wide * delta)) / energy if energy > 0.0 else 0.0
    return ortho.reshape(shape), factor
