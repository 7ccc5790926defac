"""Safetensors encoding of NumPy arrays, written once for every backend.

NumPy's own Safetensors loader cannot produce bf16 or fp8 arrays. Encoding writes the bytes the
format-level ``serialize`` of the ``safetensors`` package writes, with one copy of the data
instead of its two (held to ``serialize``'s bytes by the tests); decoding parses and validates the
header here and returns read-only views into the payload bytes (``safetensors.deserialize``
copies every tensor, which made validating a contribution cost 2.5× its payload in memory).
bf16 and fp8 get ``ml_dtypes`` NumPy dtypes, so a bf16 tensor keeps its bits across frameworks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import ml_dtypes
import numpy as np
from safetensors import TensorSpec, serialize

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


SERIALIZE_RANK: dict[str, int] = {
    code: rank
    for rank, code in enumerate(
        ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64")
    )
}
"""The ``safetensors`` package's tensor order: its dtype enum, highest first, then the name
(bytewise, which is code-point order in UTF-8). ``tests/test_payload_encode.py`` holds
:func:`encode` to ``safetensors.serialize``'s bytes for every dtype here."""


def encode(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialize named arrays (little-endian, C order) with string metadata: the bytes
    ``safetensors.serialize`` writes, built with one copy of the data (``bytes.join`` over
    :func:`encode_pieces`; ``serialize`` copies twice, into its buffer and then into Python
    ``bytes``: 0.38 s against 0.17 s for 256 MB, docs/benchmarks-log.md)."""
    pieces = encode_pieces(arrays, metadata)
    return pieces[0] if len(pieces) == 1 and isinstance(pieces[0], bytes) else b"".join(pieces)


def encode_pieces(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> list[bytes | memoryview]:
    """The bytes of :func:`encode` as pieces in order, without copying the data: the length
    and JSON header, then each array's own buffer (a contiguous little-endian copy only where an
    array is neither), for a store that writes pieces as they are. Metadata of more than one
    entry, or names and values with control characters, go through ``serialize`` itself (its
    metadata map has no fixed order; its JSON escapes are its own): one piece."""
    prepared: list[tuple[str, str, np.ndarray]] = []
    for name, array in arrays.items():
        dtype_name = dtype_name_of(array)
        contiguous = np.ascontiguousarray(array)
        if contiguous.dtype.byteorder == ">":
            contiguous = contiguous.byteswap().view(contiguous.dtype.newbyteorder("<"))
        prepared.append((name, dtype_name, contiguous))
    texts = [name for name, _, _ in prepared] + [text for item in (metadata or {}).items() for text in item]
    if (metadata and len(metadata) > 1) or any(ord(char) < 0x20 for text in texts for char in text):
        return [_serialize(prepared, metadata)]
    ordered = sorted(prepared, key=lambda item: (-SERIALIZE_RANK[DTYPES[item[1]][0]], item[0].encode("utf-8", "surrogatepass")))
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, dtype_name, array in ordered:
        header[name] = {
            "dtype": DTYPES[dtype_name][0],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    try:
        text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: let serialize say what it makes of it
        return [_serialize(prepared, metadata)]
    text += b" " * (-len(text) % 8)
    pieces: list[bytes | memoryview] = [len(text).to_bytes(8, "little") + text]
    pieces += [array.reshape(-1).view(np.uint8).data for _, _, array in ordered]
    return pieces


def _serialize(prepared: list[tuple[str, str, np.ndarray]], metadata: Mapping[str, str] | None) -> bytes:
    specs = {
        name: TensorSpec(
            dtype=dtype_name,
            shape=list(array.shape),
            data_ptr=array.ctypes.data if array.nbytes else 0,
            data_len=array.nbytes,
        )
        for name, dtype_name, array in prepared
    }
    data = serialize(specs, dict(metadata) if metadata else None)  # ``prepared`` keeps the buffers alive
    return bytes(data)


MAX_HEADER_BYTES = 100_000_000
"""Largest JSON header accepted (the limit the ``safetensors`` package itself applies)."""


def decode(data: bytes | bytearray | memoryview) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Named arrays and metadata; any malformed input raises ``CorruptPayload`` naming the fault.

    Zero-copy: the arrays are read-only ``np.frombuffer`` views into ``data`` (which they keep
    alive), in data-offset order. Whoever needs a writable array copies it. Nothing is returned
    unless the whole payload validates: 8-byte little-endian length, a bounded UTF-8
    JSON object without duplicate keys, ``__metadata__`` a string-to-string object, every
    tensor ``{"dtype", "shape", "data_offsets"}`` with a known dtype, a shape of
    non-negative ints and ``end - begin = prod(shape) × itemsize``, and the tensors' byte
    ranges contiguous, in order, without overlap and covering the data section exactly (no
    trailing bytes).
    """
    view = memoryview(data).cast("B").toreadonly()
    total = len(view)
    if total < 8:
        raise CorruptPayload(f"payload is not valid safetensors: {total} bytes, shorter than the 8-byte header length")
    header_len = int.from_bytes(view[:8], "little")
    if header_len > MAX_HEADER_BYTES:
        raise CorruptPayload(f"payload is not valid safetensors: header of {header_len} bytes exceeds {MAX_HEADER_BYTES}")
    if 8 + header_len > total:
        raise CorruptPayload(
            f"payload is not valid safetensors: header of {header_len} bytes runs past the end of the {total}-byte payload"
        )
    header = _parse_header(bytes(view[8 : 8 + header_len]))
    metadata = _metadata(header.pop("__metadata__", None))
    data_start = 8 + header_len
    data_len = total - data_start
    layout: list[tuple[int, int, str, np.dtype, tuple[int, ...]]] = []
    for index, (name, info) in enumerate(header.items()):
        dtype, shape, begin = _tensor_info(name, info)
        layout.append((begin, index, name, dtype, shape))
    arrays: dict[str, np.ndarray] = {}
    cursor = 0
    for begin, _, name, dtype, shape in sorted(layout):
        count = math.prod(shape)
        if begin != cursor:
            problem = "overlaps the previous tensor" if begin < cursor else f"leaves a gap of {begin - cursor} bytes"
            raise CorruptPayload(f"tensor {name!r}: data_offsets start at {begin}, expected {cursor} ({problem})")
        cursor = begin + count * dtype.itemsize
        if cursor > data_len:
            raise CorruptPayload(f"tensor {name!r}: data ends at byte {cursor}, past the {data_len}-byte data section")
        array = np.frombuffer(view, dtype=dtype, count=count, offset=data_start + begin) if count else np.empty(0, dtype)
        array = array.reshape(shape)
        array.flags.writeable = False
        arrays[name] = array
    if cursor != data_len:
        raise CorruptPayload(f"payload has {data_len - cursor} trailing bytes after the last tensor's data")
    return arrays, metadata


def _parse_header(raw: bytes) -> dict[str, object]:
    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        result: dict[str, object] = {}
        for key, value in pairs:
            if key in result:
                raise ValueError(f"duplicate key {key!r}")
            result[key] = value
        return result

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptPayload(f"payload is not valid safetensors: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CorruptPayload(f"payload is not valid safetensors: header is a JSON {type(header).__name__}, not an object")
    return header


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise CorruptPayload("payload is not valid safetensors: __metadata__ is not an object of strings")
    return {str(k): v for k, v in value.items()}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor_info(name: str, info: object) -> tuple[np.dtype, tuple[int, ...], int]:
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        keys = sorted(info) if isinstance(info, dict) else type(info).__name__
        raise CorruptPayload(f"tensor {name!r}: header entry must hold exactly dtype, shape, data_offsets (got {keys})")
    code = info["dtype"]
    if not isinstance(code, str) or code not in _BY_CODE:
        raise CorruptPayload(f"tensor {name!r} has unsupported dtype {code}")
    shape = info["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise CorruptPayload(f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
    offsets = info["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) and o >= 0 for o in offsets):
        raise CorruptPayload(f"tensor {name!r}: data_offsets {offsets!r} are not two non-negative integers")
    begin, end = offsets
    dtype = _BY_CODE[code][1]
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected:
        raise CorruptPayload(
            f"tensor {name!r}: data_offsets [{begin}, {end}] hold {end - begin} bytes, shape {shape} of {code} needs {expected}"
        )
    return dtype, tuple(shape), begin
