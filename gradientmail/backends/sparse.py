"""Chunked top-k sparsification of fp32 tensors (SparseLoCo's wire form, issue 26).

A tensor is flattened and cut into chunks of ``chunk`` elements (the last one may be short).
Of each chunk the ``k`` elements of largest magnitude travel (all of a chunk shorter than ``k``):
their offsets in the chunk as ``uint16``, ascending, and their values quantized with one fp32
scale per chunk in one of the blockwise formats of :mod:`gradientmail.backends.quantize`
(``int2`` by default: SparseLoCo's 2 bits). Everything else is zero on arrival. With error
feedback the learner keeps what did not travel (the elements left out and the values' rounding)
and adds it to its next contribution of the fragment, so nothing is lost, only delayed.

Bytes per chunk: ``2k`` of offsets, ``k × bits / 8`` of values and 4 of scale; at
``k = 64`` of ``chunk = 4096`` with int2 values that is 0.0361 bytes per parameter, 111× fewer
than fp32. ``k`` and ``chunk`` are powers of two (a chunk's values are one block of the value
format; chunks tile the kernels' blocks), ``chunk`` at most 65 536 (offsets fit ``uint16``).

Decoding trusts nothing (:func:`densify` via ``sparse_payload``): offsets out of their chunk,
repeated, or not ascending, and counts that do not match the shape are refused with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gradientmail.backends.kernels import Scratch, run_blocks
from gradientmail.backends.quantize import Codec, QuantFormat, dequantize, quantize

__all__ = ["DEFAULT_CHUNK", "SparseCodec", "check_offsets", "densify", "sparsify", "sparsify_with_feedback"]

DEFAULT_CHUNK = 4096
"""Elements per chunk: SparseLoCo's chunk size, and 64 of them (1.56 %) a chunk's default k."""

_F32 = np.dtype(np.float32)
_INDEX = np.dtype(np.uint16)


@dataclass(frozen=True)
class SparseCodec:
    """A sparse wire form: ``k`` values of every ``chunk`` elements, quantized as ``values``."""

    k: int
    chunk: int = DEFAULT_CHUNK
    values: QuantFormat = "int2"

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 8 or self.k & (self.k - 1):
            raise ValueError(f"top-k must be a power of two >= 8, got {self.k!r}")
        if not isinstance(self.chunk, int) or self.chunk & (self.chunk - 1) or not self.k < self.chunk <= 65536:
            raise ValueError(f"sparsity chunk must be a power of two above k={self.k} and at most 65536, got {self.chunk!r}")
        self.value_codec  # noqa: B018 - the value format's own checks

    @property
    def value_codec(self) -> Codec:
        """How the chosen values travel: one block (one fp32 scale) per chunk."""
        return Codec(self.values, self.k)

    @property
    def density(self) -> float:
        return self.k / self.chunk

    @property
    def name(self) -> str:
        """How metadata and reports name it: ``top64of4096/int2``."""
        return f"top{self.k}of{self.chunk}/{self.values}"

    @classmethod
    def parse(cls, name: str) -> SparseCodec:
        """The inverse of :attr:`name`; ``ValueError`` naming what is wrong."""
        head, _, values = name.partition("/")
        k, _, chunk = head.removeprefix("top").partition("of")
        if not (head.startswith("top") and k.isdigit() and chunk.isdigit() and values):
            raise ValueError(f"sparse codec {name!r} is not top<k>of<chunk>/<format>")
        return cls(int(k), int(chunk), values)  # type: ignore[arg-type]  # checked in __post_init__

    def chosen(self, numel: int) -> int:
        """Elements that travel of a tensor of ``numel``: ``k`` per whole chunk, and of the last,
        short chunk ``k`` or all of it."""
        whole, tail = divmod(numel, self.chunk)
        return whole * self.k + min(self.k, tail)

    def chunks(self, numel: int) -> int:
        return -(-numel // self.chunk)

    def nbytes(self, numel: int) -> int:
        """Payload bytes of one tensor of ``numel`` elements (offsets, codes and scales)."""
        chosen = self.chosen(numel)
        return 2 * chosen + self.value_codec.nbytes(chosen)


def _offsets(flat: np.ndarray, codec: SparseCodec) -> np.ndarray:
    """Per chunk, the offsets of its ``k`` largest magnitudes, ascending (``uint16``, one run).
    Whole chunks are cut into the kernels' blocks (a chunk divides ``KERNEL_CHUNK``) and shared
    by the kernel threads; NumPy's partition and sort release the GIL."""
    whole = flat.size // codec.chunk
    offsets = np.empty(codec.chosen(flat.size), _INDEX)
    chunk, k = codec.chunk, codec.k

    def work(start: int, stop: int, scratch: Scratch) -> float:
        rows = (stop - start) // chunk
        magnitude = np.abs(flat[start:stop].reshape(rows, chunk))
        top = np.argpartition(magnitude, chunk - k, axis=1)[:, chunk - k :]
        top.sort(axis=1)
        first = start // chunk * k
        offsets[first : first + rows * k] = top.reshape(-1)
        return 0.0

    if whole:
        run_blocks(whole * chunk, work)
    tail = flat[whole * chunk :]
    if tail.size:
        last = np.arange(tail.size) if tail.size <= k else np.sort(np.argpartition(np.abs(tail), tail.size - k)[tail.size - k :])
        offsets[whole * k :] = last
    return offsets


def _positions(offsets: np.ndarray, codec: SparseCodec, numel: int) -> np.ndarray:
    """Flat positions of the chosen elements: each chunk's offsets plus its start."""
    whole = numel // codec.chunk
    starts = np.repeat(np.arange(whole, dtype=np.int64) * codec.chunk, codec.k)
    if offsets.size > starts.size:
        starts = np.concatenate([starts, np.full(offsets.size - starts.size, whole * codec.chunk, np.int64)])
    return starts + offsets.astype(np.int64)


def sparsify(values: np.ndarray, codec: SparseCodec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offsets (``uint16``, ascending per chunk), value codes and per-chunk fp32 scales of
    ``values``' top-k of every chunk. A chunk holding NaN or ±inf gets a non-finite scale, so
    the syncer rejects the contribution (``non_finite``)."""
    flat = np.ascontiguousarray(values, dtype=_F32).reshape(-1)
    offsets = _offsets(flat, codec)
    chosen = flat[_positions(offsets, codec, flat.size)]
    codes, scales = quantize(chosen, codec.value_codec)
    return offsets, codes, scales


def check_offsets(offsets: np.ndarray, codec: SparseCodec, numel: int) -> str | None:
    """Why ``offsets`` cannot be a tensor of ``numel`` elements under ``codec`` (None: they can):
    the count, each offset inside its chunk, and strictly ascending within every chunk (sorted,
    no repeats), as :func:`sparsify` writes them."""
    want = codec.chosen(numel)
    if offsets.dtype != _INDEX or offsets.ndim != 1 or offsets.size != want:
        return f"offsets are {offsets.dtype}{list(offsets.shape)}, {numel} elements need uint16[{want}]"
    whole = numel // codec.chunk
    body = offsets[: whole * codec.k].reshape(whole, codec.k)
    tail = offsets[whole * codec.k :]
    tail_size = numel - whole * codec.chunk
    if body.size and int(body.max()) >= codec.chunk:
        return f"an offset is past its chunk of {codec.chunk}"
    if tail.size and int(tail.max()) >= tail_size:
        return f"an offset is past the last chunk of {tail_size}"
    if body.size and not (np.diff(body.astype(np.int32), axis=1) > 0).all():
        return "offsets within a chunk are not strictly ascending (unsorted or repeated)"
    if tail.size > 1 and not (np.diff(tail.astype(np.int32)) > 0).all():
        return "offsets within the last chunk are not strictly ascending (unsorted or repeated)"
    return None


def densify(offsets: np.ndarray, codes: np.ndarray, scales: np.ndarray, codec: SparseCodec, shape: tuple[int, ...]) -> np.ndarray:
    """The fp32 tensor of ``shape`` the sparse parts describe: zero but at the chosen positions
    (a new writable array). ``ValueError`` naming what is wrong with the parts."""
    numel = math.prod(shape)
    problem = check_offsets(offsets, codec, numel)
    if problem is not None:
        raise ValueError(problem)
    chosen = dequantize(codes, scales, codec.value_codec, (offsets.size,))
    dense = np.zeros(numel, _F32)
    dense[_positions(offsets, codec, numel)] = chosen
    return dense.reshape(shape)


def sparsify_with_feedback(
    delta: np.ndarray, residual: np.ndarray | None, codec: SparseCodec
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Error feedback: sparsify ``delta + residual``; also return what did not travel (the next
    contribution's residual: the elements left out and the chosen values' rounding). All fp32."""
    target = np.asarray(delta, dtype=_F32)
    if residual is not None:
        target = target + residual
    offsets, codes, scales = sparsify(target, codec)
    left = np.subtract(target, densify(offsets, codes, scales, codec, target.shape), dtype=_F32)
    return offsets, codes, scales, left.reshape(np.shape(delta))
