"""The wire form of quantized tensors: a Safetensors payload of codes and per-block scales.

For every tensor ``name`` the payload holds two entries, ``name`` (the codes, 1-D, of the
codec's code dtype) and ``name#scales`` (fp32, one per block), and its metadata names the
codec (``{"gradientmail.quantization": "int4/128"}``). Learners publish contributions this
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
from gradientmail.errors import IncompatiblePayload

__all__ = ["METADATA_KEY", "SCALES_SUFFIX", "Parts", "decode_dequantized", "decode_parts", "encode_parts"]

METADATA_KEY = "gradientmail.quantization"
SCALES_SUFFIX = "#scales"

Parts = Mapping[str, tuple[np.ndarray, np.ndarray]]
"""Tensor name -> (codes, scales)."""


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
    tensors, metadata = payload.decode(data)
    form = metadata.get(METADATA_KEY)
    if form != codec.name:
        found = f"quantized as {form!r}" if form is not None else "not quantized"
        raise IncompatiblePayload(f"payload is {found}; the run quantizes as {codec.name!r}")
    expected = {name for name in shapes} | {name + SCALES_SUFFIX for name in shapes}
    if set(tensors) != expected:
        missing = sorted(expected - set(tensors))
        extra = sorted(set(tensors) - expected)
        raise IncompatiblePayload(f"quantized payload entries differ (missing {missing}, unexpected {extra})")
    parts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, shape in shapes.items():
        codes, scales = tensors[name], tensors[name + SCALES_SUFFIX]
        numel = int(np.prod(shape, dtype=np.int64))
        want_codes, want_scales = codec.code_count(numel), codec.scale_count(numel)
        if codes.dtype != codec.code_dtype or codes.shape != (want_codes,):
            raise IncompatiblePayload(
                f"{name}: codes are {codes.dtype}{list(codes.shape)}, {codec.name} of shape {list(shape)} needs "
                f"{codec.code_dtype}[{want_codes}]"
            )
        if scales.dtype != np.float32 or scales.shape != (want_scales,):
            raise IncompatiblePayload(f"{name}: scales are {scales.dtype}{list(scales.shape)}, expected float32[{want_scales}]")
        parts[name] = (codes, scales)
    return parts


def decode_dequantized(
    data: bytes | bytearray | memoryview, codec: Codec, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """The fp32 tensors a quantized payload describes (what a syncer merges). A block whose
    scale is not finite dequantizes to non-finite values, which validation rejects."""
    parts = decode_parts(data, codec, shapes)
    return {name: dequantize(codes, scales, codec, tuple(shapes[name])) for name, (codes, scales) in parts.items()}
