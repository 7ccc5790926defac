"""Blockwise quantization of fp32 tensors: the codes and per-block scales a payload carries.

A tensor is flattened and cut into blocks of ``block`` elements (the last one may be short);
each block gets one fp32 scale, ``absmax / qmax``, and every element one code: the value
divided by its block's scale, rounded to the format's grid. Dequantizing multiplies back in
fp32, so the syncer accumulates in fp32 whatever the wire carries.

========  =================  ======  ====================================  ==============
format    code               bits    grid (× scale)                         qmax
========  =================  ======  ====================================  ==============
int8      int8               8       −127 … 127                            127
fp8_e4m3  float8_e4m3fn      8       the e4m3 values in [−448, 448]        448
int4      two per uint8      4       −7 … 7 (nibble = code + 8, low first) 7
int2      four per uint8     2       −1.5, −0.5, 0.5, 1.5 (crumb = code)   1.5
========  =================  ======  ====================================  ==============

Everything is NumPy on host arrays in a fixed order of operations, so every backend and
every machine produces the same bytes (a replay can re-derive them). Large tensors are cut
into :data:`~gradientmail.backends.kernels.KERNEL_CHUNK` runs (whole blocks) shared by the
kernel thread pool; results never depend on the thread count. Within a run the kernels make
in-place passes over the thread's scratch blocks: block maxima on the fp32 bits (one
``reduceat``), integer codes packed with shifts on wider views, fp8 codes rounded to nearest
even on the fp32 bits (bit for bit ml_dtypes' cast, checked on every fp32 of magnitude ≤ 464), decoding
with shifts and casts instead of table look-ups. The tensor's last, short block goes through
the plain reference form, which gives the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import ml_dtypes
import numpy as np

from gradientmail.backends.kernels import KERNEL_CHUNK, Scratch, run_blocks

__all__ = [
    "DEFAULT_BLOCK",
    "FORMATS",
    "Codec",
    "QuantFormat",
    "dequantize",
    "quantize",
]

QuantFormat = Literal["int8", "fp8_e4m3", "int4", "int2"]
FORMATS: tuple[str, ...] = get_args(QuantFormat)
DEFAULT_BLOCK = 128
"""Elements per scale: 4 bytes of scale per 128 elements adds 0.25 bits per element."""

_F32 = np.dtype(np.float32)
_FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


@dataclass(frozen=True)
class Codec:
    """A quantized wire form: ``format`` and elements per scale (``block``)."""

    format: QuantFormat
    block: int = DEFAULT_BLOCK

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown quantization format {self.format!r}; known: {list(FORMATS)}")
        if not isinstance(self.block, int) or self.block < 8 or self.block % 8 or KERNEL_CHUNK % self.block:
            raise ValueError(f"quantization block must be a multiple of 8 dividing {KERNEL_CHUNK}, got {self.block!r}")

    @property
    def per_byte(self) -> int:
        """Codes packed in one byte."""
        return {"int8": 1, "fp8_e4m3": 1, "int4": 2, "int2": 4}[self.format]

    @property
    def code_dtype(self) -> np.dtype:
        dtype: np.dtype = {"int8": np.dtype(np.int8), "fp8_e4m3": _FP8}.get(self.format, np.dtype(np.uint8))
        return dtype

    @property
    def qmax(self) -> float:
        return {"int8": 127.0, "fp8_e4m3": 448.0, "int4": 7.0, "int2": 1.5}[self.format]

    def code_count(self, numel: int) -> int:
        """Entries of the code array for ``numel`` elements."""
        return -(-numel // self.per_byte)

    def scale_count(self, numel: int) -> int:
        return -(-numel // self.block)

    def nbytes(self, numel: int) -> int:
        """Payload bytes of one tensor of ``numel`` elements (codes + fp32 scales)."""
        return self.code_count(numel) * self.code_dtype.itemsize + 4 * self.scale_count(numel)

    @property
    def name(self) -> str:
        """How metadata and reports name it: ``int4/128``."""
        return f"{self.format}/{self.block}"

    @classmethod
    def parse(cls, name: str) -> Codec:
        """The inverse of :attr:`name`; ``ValueError`` naming what is wrong."""
        form, _, block = name.partition("/")
        if not block.isdigit():
            raise ValueError(f"quantization {name!r} is not <format>/<block>")
        return cls(form, int(block))  # type: ignore[arg-type]  # checked in __post_init__


def _decode_table(codec: Codec) -> np.ndarray:
    """byte -> the ``per_byte`` grid values it packs (low bits first), fp32."""
    byte = np.arange(256, dtype=np.uint16)
    if codec.format == "int4":
        return np.stack([(byte & 0xF) - 8.0, (byte >> 4) - 8.0], axis=1).astype(_F32)
    if codec.format == "int2":
        return np.stack([((byte >> (2 * i)) & 0x3) - 1.5 for i in range(4)], axis=1).astype(_F32)
    if codec.format == "int8":
        return byte.astype(np.uint8).view(np.int8).astype(_F32)[:, None]
    table: np.ndarray = byte.astype(np.uint8).view(_FP8).astype(_F32)[:, None]
    return table


_TABLES = {form: _decode_table(Codec(form)) for form in FORMATS}  # type: ignore[arg-type]


def quantize(values: np.ndarray, codec: Codec) -> tuple[np.ndarray, np.ndarray]:
    """Codes (1-D, ``codec.code_count(n)`` entries of ``codec.code_dtype``) and fp32 scales.

    A block holding NaN or ±inf gets a non-finite scale, so its dequantized values are not
    finite and a syncer rejects the contribution (``non_finite``) rather than merging noise.
    A finite block whose largest magnitude is so small (below ~2⁻¹¹⁹) that ``qmax / absmax``
    overflows fp32 is scaled by 2⁶⁴ before rounding, so its codes stay on the grid.
    """
    flat = np.ascontiguousarray(values, dtype=_F32).reshape(-1)
    numel = flat.size
    codes = np.empty(codec.code_count(numel), codec.code_dtype)
    scales = np.empty(codec.scale_count(numel), _F32)
    per_byte, block = codec.per_byte, codec.block

    def work(start: int, stop: int, scratch: Scratch) -> float:
        _quantize_run(
            flat[start:stop],
            codes[start // per_byte : -(-stop // per_byte)],
            scales[start // block : -(-stop // block)],
            codec,
            scratch,
        )
        return 0.0

    run_blocks(numel, work)
    return codes, scales


def dequantize(codes: np.ndarray, scales: np.ndarray, codec: Codec, shape: tuple[int, ...]) -> np.ndarray:
    """The fp32 tensor of ``shape`` that ``codes`` and ``scales`` describe (a new writable array).

    Raises ``ValueError`` when the arrays do not have the sizes and dtypes ``shape`` needs.
    """
    numel = math.prod(shape)
    if codes.dtype != codec.code_dtype or codes.ndim != 1 or codes.size != codec.code_count(numel):
        raise ValueError(
            f"codes are {codes.dtype}{list(codes.shape)}, {codec.name} of {numel} elements needs "
            f"{codec.code_dtype}[{codec.code_count(numel)}]"
        )
    if scales.dtype != _F32 or scales.ndim != 1 or scales.size != codec.scale_count(numel):
        raise ValueError(
            f"scales are {scales.dtype}{list(scales.shape)}, {codec.name} of {numel} elements needs "
            f"float32[{codec.scale_count(numel)}]"
        )
    out = np.empty(numel, _F32)
    table = _TABLES[codec.format]
    raw = np.ascontiguousarray(codes).view(np.uint8)
    scales = np.ascontiguousarray(scales)
    per_byte, block = codec.per_byte, codec.block

    def work(start: int, stop: int, scratch: Scratch) -> float:
        run_raw = raw[start // per_byte : -(-stop // per_byte)]
        run_scales = scales[start // block : -(-stop // block)]
        run_out = out[start:stop]
        full = run_out.size // block * block
        if full:
            _dequantize_rows(run_raw[: full // per_byte], run_scales[: full // block], run_out[:full], codec, scratch)
        if full < run_out.size:  # the tensor's last, short block
            _dequantize_run(run_raw[full // per_byte :], run_scales[full // block :], table, run_out[full:], block)
        return 0.0

    run_blocks(numel, work)
    return out.reshape(shape)


# The kernels below work on whole blocks of one KERNEL_CHUNK run with the thread's scratch
# (``f32``/``f32b``: 4 bytes an element, ``f64``: 8), one in-place NumPy pass at a time, so
# the run stays in cache and nothing is allocated per element. They give the same bytes as
# the reference forms kept for short blocks (``_quantize_blocks``, ``_dequantize_run``),
# which the tests compare them with.

_ABS_BITS = np.int32(0x7FFFFFFF)
_INF_BITS = 0x7F800000
_SAFE_BITS = 8 << 23
"""fp32 bits of 2⁻¹¹⁹: from there up ``qmax / absmax`` is finite for every qmax (< 2⁹)."""
_LIFT = np.float32(2.0**64)
"""Lifts a block whose ``qmax / absmax`` would overflow (absmax below ~2⁻¹¹⁹) into range."""
_FP8_ROUND = np.uint32(0x7FFFF + (64 << 20))
"""|y|'s bits + this (+ the kept bit, for ties to even), >> 20: the e4m3 magnitude code + 1024."""
_FP8_VALUE = np.float32(2.0**120)
"""An e4m3 code's magnitude bits << 20, read as fp32 (subnormals included), times this: its value."""
_FP8_BITS = np.uint32(0x87F00000)
_GATHER_CRUMBS = np.uint32((1 << 24) | (1 << 18) | (1 << 12) | (1 << 6))
_FP8_FOLD = np.float32(2.0**8)
"""Scales below this (finite) times 2¹²⁰ stay finite and exact, so 2¹²⁰ can go into the scales."""
_EIGHT = np.arange(8, dtype=np.intp)
_EMPTY_ROWS = np.zeros(0, np.intp)
_STARTS: dict[tuple[int, int], np.ndarray] = {}


def _block_starts(rows: int, block: int) -> np.ndarray:
    starts = _STARTS.get((rows, block))
    if starts is None:
        starts = _STARTS[(rows, block)] = np.arange(0, rows * block, block, dtype=np.intp)
    return starts


def _quantize_run(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, codec: Codec, scratch: Scratch) -> None:
    """One run of whole blocks (the tensor's last run may end in a short block)."""
    block, per_byte = codec.block, codec.per_byte
    full = x.size // block
    if full:
        _quantize_rows(x[: full * block], codes[: full * block // per_byte], scales[:full], codec, scratch)
    if x.size % block:
        tail = x[full * block :]
        padded = np.zeros(-(-tail.size // per_byte) * per_byte, _F32)
        padded[: tail.size] = tail
        _quantize_blocks(padded.reshape(1, -1), codes, scales[full:], codec, full * block // per_byte)


def _quantize_rows(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, codec: Codec, scratch: Scratch) -> None:
    """Whole blocks: the same scales and codes as ``_quantize_blocks``, in scratch."""
    n, block = x.size, codec.block
    rows = n // block
    qmax = np.float32(codec.qmax)
    magnitude = scratch.f32[:n]  # |x| (as bits for the block maxima: the same order, and NaN above inf)
    peak_bits = np.maximum.reduceat(
        np.bitwise_and(x.view(np.int32), _ABS_BITS, out=magnitude.view(np.int32)), _block_starts(rows, block)
    )
    absmax = peak_bits.view(_F32)
    np.divide(absmax, qmax, out=scales)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inverse = np.divide(qmax, absmax)
    lift = _EMPTY_ROWS
    if not (peak_bits.min() >= _SAFE_BITS and peak_bits.max() < _INF_BITS):  # zero, tiny or non-finite blocks
        inverse[peak_bits == 0] = 0.0
        inverse[peak_bits >= _INF_BITS] = np.nan  # a non-finite block stays non-finite
        lift = np.flatnonzero(np.isinf(inverse))
        inverse[lift] = 0.0
    with np.errstate(invalid="ignore"):  # a non-finite block's codes are arbitrary: its scale is not finite
        if codec.format == "fp8_e4m3":
            _encode_fp8_rows(x, magnitude, inverse, codes.view(np.uint8), scratch)
        else:
            y = scratch.f32b[:n]
            np.multiply(x.reshape(rows, block), inverse[:, None], out=y.reshape(rows, block))
            _encode_int_rows(y, codes, codec, scratch)
    per_row = block // codec.per_byte
    for row in lift:  # qmax / absmax overflows: scale the block up first (its scale stays absmax / qmax)
        lifted = x[row * block : (row + 1) * block] * _LIFT
        y_row = lifted * (qmax / (absmax[row] * _LIFT))
        with np.errstate(invalid="ignore"):
            _encode(y_row, codes[row * per_row : (row + 1) * per_row], codec)


def _encode_int_rows(y: np.ndarray, codes: np.ndarray, codec: Codec, scratch: Scratch) -> None:
    """int8 / int4 / int2 codes of ``y`` (scaled values, overwritten) into ``codes``."""
    n = y.size
    if codec.format == "int2":  # cells of width 1 centred on ±0.5, ±1.5
        np.floor(y, out=y)  # in −2 … 1 already (|y| ≤ 1.5 · (1 + 2⁻²³)): the reference's clip changes nothing
    else:
        np.rint(y, out=y)
        if codec.format == "int8":
            np.copyto(codes, y, casting="unsafe")
            return
    small = scratch.f64.view(np.int8)[:n]  # one code a byte: int4 code + 8, int2 crumb
    np.copyto(small, y, casting="unsafe")
    np.add(small, np.int8(8 if codec.format == "int4" else 2), out=small)
    if codec.format == "int4":  # two bytes lo, hi -> lo | hi << 4 (low nibble first)
        pairs = small.view(np.uint16)
        shifted = scratch.f32.view(np.uint16)[: n // 2]
        np.right_shift(pairs, 4, out=shifted)
        np.bitwise_or(pairs, shifted, out=codes, casting="unsafe")
        return
    # four bytes c0..c3 (each ≤ 3) -> c0 | c1 << 2 | c2 << 4 | c3 << 6: one multiply moves each
    # crumb into the top byte (c0 << 24, c1 << 26, c2 << 28, c3 << 30); the other products stay
    # below 2²⁴ (at most 16 570 704) or fall off the top, so nothing carries into the top byte
    quads = small.view(np.uint32)
    np.multiply(quads, _GATHER_CRUMBS, out=quads)
    np.right_shift(quads, 24, out=quads)
    np.copyto(codes, quads, casting="unsafe")


def _encode_fp8_rows(x: np.ndarray, magnitude: np.ndarray, inverse: np.ndarray, codes: np.ndarray, scratch: Scratch) -> None:
    """float8_e4m3fn codes (as bytes) of ``x · inverse`` per block, bit for bit ml_dtypes' cast
    (round to nearest even) for every |x · inverse| ≤ 464, on the fp32 bits instead of a
    per-element cast. A finite block's values are at most 448.0001; a non-finite block's codes
    are arbitrary (its scale is not finite). ``magnitude`` holds |x| and is overwritten."""
    n = x.size
    rows = inverse.size
    np.multiply(magnitude.reshape(rows, -1), inverse[:, None], out=magnitude.reshape(rows, -1))  # |y|, as inverse ≥ 0
    bits = magnitude.view(np.uint32)
    work = scratch.f32b.view(np.uint32)[:n]
    np.right_shift(bits, 20, out=work)
    np.bitwise_and(work, np.uint32(1), out=work)  # the last kept mantissa bit: ties go to even
    np.add(work, bits, out=work)
    np.add(work, _FP8_ROUND, out=work)
    np.right_shift(work, 20, out=work)  # 1024 + the magnitude code for 2⁻⁶ ≤ |y| ≤ 464 (|y| ≤ 448.0001 here)
    flags = scratch.f64.view(np.uint8)
    subnormal = flags[:n].view(np.bool_)
    np.less(work, np.uint32(1032), out=subnormal)  # |y| < 2⁻⁶ (or zero): e4m3 subnormals, multiples of 2⁻⁹
    np.copyto(codes, work, casting="unsafe")  # the low byte: the magnitude code
    words = np.flatnonzero(subnormal.view(np.uint64) != 0)  # eight flags a word: few words to look into
    if words.size:
        index = (words[:, None] * 8 + _EIGHT).reshape(-1)
        index = index[subnormal[index]]
        codes[index] = np.rint(magnitude[index] * np.float32(512)).astype(np.uint8)
    sign = flags[n : 2 * n]
    np.signbit(x, out=sign.view(np.bool_))
    np.multiply(sign, np.uint8(0x80), out=sign)
    np.bitwise_or(codes, sign, out=codes)


def _dequantize_rows(raw: np.ndarray, scales: np.ndarray, out: np.ndarray, codec: Codec, scratch: Scratch) -> None:
    """Whole blocks: grid values into ``out`` with integer and fp32 passes, then times the scales."""
    n = out.size
    factors, values = scales, out
    if codec.format == "int8":
        np.copyto(out, raw.view(np.int8), casting="unsafe")
    elif codec.format == "fp8_e4m3":
        wide = scratch.f32.view(np.int32)[:n]
        np.copyto(wide, raw.view(np.int8), casting="unsafe")  # sign-extended: the sign lands in bit 31
        np.left_shift(wide, 20, out=wide)
        np.bitwise_and(wide.view(np.uint32), _FP8_BITS, out=wide.view(np.uint32))
        with np.errstate(invalid="ignore"):
            peak = np.max(np.abs(scales))
        if peak < _FP8_FOLD:  # (v · 2⁻¹²⁰) · (s · 2¹²⁰) is v · s exactly: the same product, one pass fewer
            factors = scales * _FP8_VALUE
            values = wide.view(_F32)
        else:
            np.multiply(wide.view(_F32), _FP8_VALUE, out=out)
        low = scratch.f64.view(np.uint8)[:n]
        np.bitwise_and(raw, np.uint8(0x7F), out=low)
        if low.max() == 0x7F:  # NaN codes (0x7F, 0xFF): NaN as the table has it
            index = np.flatnonzero(low == 0x7F)
            values[index] = _TABLES["fp8_e4m3"][raw[index], 0]  # NaN: the same whatever the factor
    elif codec.format == "int4":
        pairs = scratch.f64.view(np.uint16)[: n // 2]
        np.copyto(pairs, raw, casting="unsafe")
        shifted = scratch.f32.view(np.uint16)[: n // 2]
        np.left_shift(pairs, 4, out=shifted)
        np.bitwise_or(pairs, shifted, out=pairs)
        np.bitwise_and(pairs, np.uint16(0x0F0F), out=pairs)  # bytes: low nibble, high nibble
        nibbles = pairs.view(np.int8)
        np.subtract(nibbles, np.int8(8), out=nibbles)
        np.copyto(out, nibbles, casting="unsafe")
    else:
        quads = scratch.f64.view(np.uint32)[: n // 4]
        np.copyto(quads, raw, casting="unsafe")
        moved = scratch.f32.view(np.uint32)[: n // 4]
        spread = scratch.f32.view(np.uint32)[n // 4 : n // 2]
        np.left_shift(quads, 6, out=moved)
        np.bitwise_or(quads, moved, out=spread)
        np.left_shift(quads, 12, out=moved)
        np.bitwise_or(spread, moved, out=spread)
        np.left_shift(quads, 18, out=moved)
        np.bitwise_or(spread, moved, out=spread)
        np.bitwise_and(spread, np.uint32(0x03030303), out=spread)  # bytes: crumbs 0..3
        np.copyto(out, spread.view(np.uint8), casting="unsafe")
        np.add(out, np.float32(-1.5), out=out)
    rows = scales.size
    with np.errstate(over="ignore", invalid="ignore"):  # a non-finite scale makes its block non-finite
        np.multiply(values.reshape(rows, -1), factors[:, None], out=out.reshape(rows, -1))


def _quantize_blocks(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, codec: Codec, first_code: int) -> None:
    """The reference form (a tensor's last, short block): scales, then ``_encode``."""
    absmax = np.max(np.abs(x), axis=1)
    np.divide(absmax, np.float32(codec.qmax), out=scales)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inverse = np.where(absmax > 0, np.float32(codec.qmax) / absmax, np.float32(0)).astype(_F32)
        inverse[~np.isfinite(absmax)] = np.nan  # a non-finite block stays non-finite
        lift = np.isinf(inverse)  # qmax / absmax overflows: scale the block up first
        y = x * inverse[:, None]
        y[lift] = (x[lift] * _LIFT) * (np.float32(codec.qmax) / (absmax[lift, None] * _LIFT))
        _encode(y.reshape(-1), codes[first_code : first_code + y.size // codec.per_byte], codec)


def _encode(y: np.ndarray, target: np.ndarray, codec: Codec) -> None:
    """Codes of the scaled values ``y`` (1-D, a multiple of ``per_byte``) into ``target``."""
    if codec.format == "fp8_e4m3":
        target[:] = y.astype(_FP8)
        return
    if codec.format == "int2":  # cells of width 1 centred on ±0.5, ±1.5
        q = np.clip(np.floor(y) + np.float32(2), 0, 3).astype(np.uint8).reshape(-1, 4)
        target[:] = q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)
        return
    q = np.rint(y)
    if codec.format == "int8":
        target[:] = q.astype(np.int8)
        return
    nibbles = (q + np.float32(8)).astype(np.uint8).reshape(-1, 2)
    target[:] = nibbles[:, 0] | (nibbles[:, 1] << 4)


def _dequantize_run(raw: np.ndarray, scales: np.ndarray, table: np.ndarray, out: np.ndarray, block: int) -> None:
    """The reference form (a tensor's last, short block): the byte → grid values table."""
    values = table[raw].reshape(-1)[: out.size]
    full = out.size // block
    with np.errstate(over="ignore", invalid="ignore"):  # a non-finite scale makes its block non-finite
        if full:
            np.multiply(
                values[: full * block].reshape(full, block), scales[:full, None], out=out[: full * block].reshape(full, block)
            )
        if out.size % block:
            np.multiply(values[full * block :], scales[full], out=out[full * block :])


def quantize_with_feedback(
    delta: np.ndarray, residual: np.ndarray | None, codec: Codec
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Error feedback: quantize ``delta + residual``; also return what the codes could not carry
    (the next contribution's residual). All fp32."""
    target = np.asarray(delta, dtype=_F32)
    if residual is not None:
        target = target + residual
    codes, scales = quantize(target, codec)
    left = np.subtract(target, dequantize(codes, scales, codec, target.shape), dtype=_F32)
    return codes, scales, left.reshape(np.shape(delta))
