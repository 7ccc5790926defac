"""Safetensors encoding of NumPy arrays, written once for every backend.

NumPy's own Safetensors loader cannot produce bf16 or fp8 arrays; we go through the
format-level ``serialize``/``deserialize`` of the ``safetensors`` package and give those
dtypes ``ml_dtypes`` NumPy dtypes, so a bf16 tensor keeps its bits across frameworks.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, TensorSpec, deserialize, serialize

from gradientmail.errors import CorruptPayload

# canonical dtype name (NumPy spelling, also what TensorSpec takes) -> (header code, NumPy dtype)
DTYPES: dict[str, tuple[str, np.dtype]] = {
    "float64": ("F64", np.dtype(np.float64)),
    "float32": ("F32", np.dtype(np.float32)),
    "float16": ("F16", np.dtype(np.float16)),
    "bfloat16": ("BF16", np.dtype(ml_dtypes.bfloat16)),
    "float8_e4m3fn": ("F8_E4M3", np.dtype(ml_dtypes.float8_e4m3fn)),
    "float8_e5m2": ("F8_E5M2", np.dtype(ml_dtypes.float8_e5m2)),
    "int64": ("I64", np.dtype(np.int64)),
    "int32": ("I32", np.dtype(np.int32)),
    "int16": ("I16", np.dtype(np.int16)),
    "int8": ("I8", np.dtype(np.int8)),
    "uint64": ("U64", np.dtype(np.uint64)),
    "uint32": ("U32", np.dtype(np.uint32)),
    "uint16": ("U16", np.dtype(np.uint16)),
    "uint8": ("U8", np.dtype(np.uint8)),
    "bool": ("BOOL", np.dtype(np.bool_)),
}
FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"})
_BY_CODE = {code: (name, dtype) for name, (code, dtype) in DTYPES.items()}
_BY_NUMPY = {dtype: name for name, (_, dtype) in DTYPES.items()}


def dtype_name_of(array: np.ndarray) -> str:
    """Canonical name of a NumPy array's dtype; raises ``TypeError`` for unsupported ones."""
    try:
        return _BY_NUMPY[array.dtype]
    except KeyError:
        raise TypeError(f"dtype {array.dtype} cannot travel in a payload") from None


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype for a canonical dtype name."""
    try:
        return DTYPES[name][1]
    except KeyError:
        raise TypeError(f"unknown dtype {name!r}; known: {sorted(DTYPES)}") from None


def encode(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialize named arrays (little-endian, C order) with string metadata."""
    keep_alive: list[np.ndarray] = []
    specs: dict[str, TensorSpec] = {}
    for name, array in arrays.items():
        dtype_name = dtype_name_of(array)
        contiguous = np.ascontiguousarray(array)
        if contiguous.dtype.byteorder == ">":
            contiguous = contiguous.byteswap().view(contiguous.dtype.newbyteorder("<"))
        keep_alive.append(contiguous)
        specs[name] = TensorSpec(
            dtype=dtype_name,
            shape=list(contiguous.shape),
            data_ptr=contiguous.ctypes.data if contiguous.nbytes else 0,
            data_len=contiguous.nbytes,
        )
    data = serialize(specs, dict(metadata) if metadata else None)
    del keep_alive  # the buffers had to outlive serialize()
    return bytes(data)


def decode(data: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Named arrays and metadata; any malformed input raises ``CorruptPayload``."""
    try:
        entries = deserialize(bytes(data))  # type: ignore[no-untyped-call]  # safetensors' stub leaves deserialize unannotated
        metadata = _read_metadata(data)
    except (SafetensorError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptPayload(f"payload is not valid safetensors: {exc}") from None
    arrays: dict[str, np.ndarray] = {}
    for name, entry in entries:
        code = entry["dtype"]
        if code not in _BY_CODE:
            raise CorruptPayload(f"tensor {name!r} has unsupported dtype {code}")
        dtype = _BY_CODE[code][1]
        buffer = entry["data"]
        arrays[name] = np.frombuffer(buffer, dtype=dtype).reshape(entry["shape"])
    return arrays, metadata


def _read_metadata(data: bytes) -> dict[str, str]:
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    metadata = header.get("__metadata__") or {}
    return {str(k): str(v) for k, v in metadata.items()}
