"""The wire form of quantized tensors: a Safetensors payload of codes and per-block scales.

For every tensor ``name`` the payload holds two entries, ``name`` (the codes, 1-D, of the
codec's code dtype) and ``name#scales`` (fp32, one per block), and its metadata names the
codec (``{"gradientmail.quantization": "int4/128"}``). A sparse payload (``backends/sparse.py``)
adds ``name#offsets`` (``uint16``, each chunk's chosen offsets, ascending), its codes and scales
those of the chosen values, one scale per chunk (``"top64of4096/int2"``). Learners publish contributions this
way when the run sets ``delta_quantization``, and syncers publish each commit's change from
the previous version this way when it sets ``update_quantization`` (docs/protocol.md).
Decoding trusts nothing: a payload of another codec, missing or extra entries, or codes and
scales of the wrong size or dtype are refused with the reason, before any arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gradientmail.backends import payload
from gradientmail.backends.quantize import Codec, dequantize
from gradientmail.backends.sparse import SparseCodec, check_offsets, densify
from gradientmail.errors import IncompatiblePayload

__all__ = [
    "METADATA_KEY",
    "OFFSETS_SUFFIX",
    "SCALES_SUFFIX",
    "Parts",
    "SparseParts",
    "decode_dequantized",
    "decode_parts",
    "decode_sparse_parts",
    "encode_parts",
    "encode_sparse_parts",
]

METADATA_KEY = "gradientmail.quantization"
SCALES_SUFFIX = "#scales"
OFFSETS_SUFFIX = "#offsets"

Parts = Mapping[str, tuple[np.ndarray, np.ndarray]]
"""Tensor name -> (codes, scales)."""
SparseParts = Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
"""Tensor name -> (offsets, value codes, scales) of a sparse payload (``backends/sparse.py``)."""


def encode_parts(parts: Parts, codec: Codec) -> bytes:
    """One payload of every tensor's codes and scales; ``ValueError`` if a tensor's name
    collides with another's scales entry."""
    arrays: dict[str, np.ndarray] = {}
    for name, (codes, scales) in parts.items():
        scales_name = name + SCALES_SUFFIX
        if scales_name in parts:
            raise ValueError(f"tensor names {name!r} and {scales_name!r} collide in a quantized payload")
        arrays[name] = codes
        arrays[scales_name] = scales
    return payload.encode(arrays, {METADATA_KEY: codec.name})


def decode_parts(
    data: bytes | bytearray | memoryview, codec: Codec, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Codes and scales of every tensor in ``shapes``, checked against ``codec``.

    Raises ``CorruptPayload`` (not Safetensors) or ``IncompatiblePayload`` (another codec,
    other tensors, wrong sizes or dtypes), naming what is wrong.
    """
    tensors = _entries(data, codec.name, shapes, (SCALES_SUFFIX,))
    parts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, shape in shapes.items():
        codes, scales = tensors[name], tensors[name + SCALES_SUFFIX]
        _check_values(name, codes, scales, codec, int(np.prod(shape, dtype=np.int64)), list(shape))
        parts[name] = (codes, scales)
    return parts


def encode_sparse_parts(parts: SparseParts, codec: SparseCodec) -> bytes:
    """One payload of every tensor's offsets, value codes and scales; ``ValueError`` if a
    tensor's name collides with another's entry."""
    arrays: dict[str, np.ndarray] = {}
    for name, (offsets, codes, scales) in parts.items():
        for suffix in (SCALES_SUFFIX, OFFSETS_SUFFIX):
            if name + suffix in parts:
                raise ValueError(f"tensor names {name!r} and {name + suffix!r} collide in a sparse payload")
        arrays[name], arrays[name + SCALES_SUFFIX], arrays[name + OFFSETS_SUFFIX] = codes, scales, offsets
    return payload.encode(arrays, {METADATA_KEY: codec.name})


def decode_sparse_parts(
    data: bytes | bytearray | memoryview, codec: SparseCodec, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Offsets, value codes and scales of every tensor in ``shapes``, checked against ``codec``:
    offsets inside their chunk, strictly ascending in each (sorted, no repeats), as many as the
    shape has chosen elements. Raises ``CorruptPayload`` or ``IncompatiblePayload`` naming what
    is wrong, before any arithmetic."""
    tensors = _entries(data, codec.name, shapes, (SCALES_SUFFIX, OFFSETS_SUFFIX))
    parts: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for name, shape in shapes.items():
        numel = int(np.prod(shape, dtype=np.int64))
        offsets, codes, scales = tensors[name + OFFSETS_SUFFIX], tensors[name], tensors[name + SCALES_SUFFIX]
        problem = check_offsets(offsets, codec, numel)
        if problem is not None:
            raise IncompatiblePayload(f"{name}: {problem}")
        _check_values(name, codes, scales, codec.value_codec, codec.chosen(numel), list(shape))
        parts[name] = (offsets, codes, scales)
    return parts


def _entries(
    data: bytes | bytearray | memoryview, form: str, shapes: Mapping[str, tuple[int, ...]], suffixes: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """The payload's arrays, when its metadata names ``form`` and it holds exactly each tensor of
    ``shapes`` and its ``suffixes`` entries."""
    tensors, metadata = payload.decode(data)
    found = metadata.get(METADATA_KEY)
    if found != form:
        described = f"quantized as {found!r}" if found is not None else "not quantized"
        raise IncompatiblePayload(f"payload is {described}; the run quantizes as {form!r}")
    expected = {name + suffix for name in shapes for suffix in ("", *suffixes)}
    if set(tensors) != expected:
        missing = sorted(expected - set(tensors))
        extra = sorted(set(tensors) - expected)
        raise IncompatiblePayload(f"quantized payload entries differ (missing {missing}, unexpected {extra})")
    return tensors


def _check_values(name: str, codes: np.ndarray, scales: np.ndarray, codec: Codec, count: int, shape: list[int]) -> None:
    """Codes and scales of ``count`` values in ``codec``, or ``IncompatiblePayload``."""
    want_codes, want_scales = codec.code_count(count), codec.scale_count(count)
    if codes.dtype != codec.code_dtype or codes.shape != (want_codes,):
        raise IncompatiblePayload(
            f"{name}: codes are {codes.dtype}{list(codes.shape)}, {codec.name} of shape {shape} needs "
            f"{codec.code_dtype}[{want_codes}]"
        )
    if scales.dtype != np.float32 or scales.shape != (want_scales,):
        raise IncompatiblePayload(f"{name}: scales are {scales.dtype}{list(scales.shape)}, expected float32[{want_scales}]")


def decode_dequantized(
    data: bytes | bytearray | memoryview, codec: Codec | SparseCodec, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """The fp32 tensors a quantized or sparse payload describes (what a syncer merges). A block
    or chunk whose scale is not finite dequantizes to non-finite values, which validation rejects."""
    if isinstance(codec, SparseCodec):
        sparse = decode_sparse_parts(data, codec, shapes)
        return {name: densify(*arrays, codec, tuple(shapes[name])) for name, arrays in sparse.items()}
    parts = decode_parts(data, codec, shapes)
    return {name: dequantize(codes, scales, codec, tuple(shapes[name])) for name, (codes, scales) in parts.items()}
