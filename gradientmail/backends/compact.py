"""A commit's compact change from the previous version (INV-16): quantized, or sparse.

With ``update_quantization`` (a :class:`~gradientmail.backends.quantize.Codec`) the change
travels whole, blockwise quantized; with ``update_sparsity`` (a
:class:`~gradientmail.backends.sparse.SparseCodec`) only each chunk's largest changes travel,
their values quantized as ``update_quantization`` (``int4`` when unset). Either way the
committed parameters are *defined* as ``old + decoded change`` in fp32, cast to ``old``'s dtype,
so the syncer that commits them and a learner that rebuilds them from the update hold the same
bytes; the outer step's exact result stays in the outer state as the fp32 master, so what
did not travel (rounding, the changes left out) is part of the next commit's change: error
feedback on the syncer's side.

Parts are ``(codes, scales)`` for a quantized change and ``(offsets, codes, scales)`` for a
sparse one, as :mod:`gradientmail.backends.quantized_payload` writes and reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gradientmail.backends import quantized_payload
from gradientmail.backends.quantize import Codec, dequantize, quantize
from gradientmail.backends.sparse import SparseCodec, densify, sparsify

__all__ = ["UpdateCodec", "UpdateParts", "apply_update", "compact_update", "decode_update", "encode_update"]

UpdateCodec = Codec | SparseCodec
UpdateParts = tuple[np.ndarray, ...]
"""``(codes, scales)`` of a quantized change, ``(offsets, codes, scales)`` of a sparse one."""

_F32 = np.dtype(np.float32)


def _change(parts: UpdateParts, codec: UpdateCodec, shape: tuple[int, ...]) -> np.ndarray:
    """The fp32 change ``parts`` describe (a new writable array)."""
    if isinstance(codec, SparseCodec):
        offsets, codes, scales = parts
        return densify(offsets, codes, scales, codec, shape)
    codes, scales = parts
    return dequantize(codes, scales, codec, shape)


def apply_update(old: np.ndarray, parts: UpdateParts, codec: UpdateCodec) -> np.ndarray:
    """``old + change`` in fp32, cast to ``old``'s dtype: how a learner one version behind
    rebuilds a commit from its compact update, and how the syncer makes that commit, so both
    hold the same bytes."""
    update = _change(parts, codec, old.shape)
    np.add(update, old, out=update)  # fp32 + (old widened to fp32): the same IEEE sum either way
    return update if old.dtype == _F32 else update.astype(old.dtype)


def compact_update(old: np.ndarray, target: np.ndarray, codec: UpdateCodec) -> tuple[UpdateParts, np.ndarray]:
    """The parts of ``target − old`` and the parameters they rebuild (``apply_update``), which is
    what gets committed; ``target`` (fp32, the outer step's exact result) stays in the outer
    state as the master copy, so nothing left out accumulates across versions."""
    update = np.subtract(target, old, dtype=_F32)
    parts: UpdateParts = sparsify(update, codec) if isinstance(codec, SparseCodec) else quantize(update, codec)
    return parts, apply_update(old, parts, codec)


def encode_update(parts: Mapping[str, UpdateParts], codec: UpdateCodec) -> bytes:
    """The update blob of every tensor's parts."""
    if isinstance(codec, SparseCodec):
        return quantized_payload.encode_sparse_parts({n: (p[0], p[1], p[2]) for n, p in parts.items()}, codec)
    return quantized_payload.encode_parts({n: (p[0], p[1]) for n, p in parts.items()}, codec)


def decode_update(
    data: bytes | bytearray | memoryview, codec: UpdateCodec, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, UpdateParts]:
    """The parts of every tensor in ``shapes``, checked against ``codec`` before any arithmetic
    (``CorruptPayload`` / ``IncompatiblePayload`` naming what is wrong)."""
    if isinstance(codec, SparseCodec):
        return dict(quantized_payload.decode_sparse_parts(data, codec, shapes))
    return dict(quantized_payload.decode_parts(data, codec, shapes))
