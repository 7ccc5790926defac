"""Blockwise quantization (gradientmail.backends.quantize): bytes, bounds and the API around them.

The encoded bytes are pinned: sha256 of the codes, scales and dequantized values of a seeded
tensor (recorded with the first implementation, before the kernels were rewritten for speed),
a hand-checked example per format, and a plain reference implementation (the first one's
algorithm) compared on assorted inputs. fp8 codes equal ml_dtypes' cast; every byte decodes
as the format's table says. Round trips stay within each format's bound, on any size, shape
and kernel thread count.
"""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import pytest

from gradientmail.backends import kernels
from gradientmail.backends.compact import apply_update, compact_update
from gradientmail.backends.kernels import KERNEL_CHUNK
from gradientmail.backends.quantize import (
    DEFAULT_BLOCK,
    FORMATS,
    Codec,
    dequantize,
    quantize,
    quantize_with_feedback,
)

C = KERNEL_CHUNK
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
SIZES = [0, 1, 7, DEFAULT_BLOCK - 1, DEFAULT_BLOCK, DEFAULT_BLOCK + 1, 5 * DEFAULT_BLOCK + 3, C + 77, 2 * C + DEFAULT_BLOCK]
SHAPES = [(33, 40), (3, 5, 129), (2, 1, 128), (4, C // 4 + 3)]


@pytest.fixture
def threads():
    """Restore the kernel thread count after a test that changes it."""
    previous = kernels.kernel_threads()
    yield kernels.set_kernel_threads
    kernels.set_kernel_threads(previous)


def gaussian(size: int, seed: int = 0) -> np.ndarray:
    """Gaussian values whose scale changes from block to block (1e-6 … 1e6)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(size).astype(np.float32)
    blocks = -(-size // 64)
    x *= np.repeat((10.0 ** rng.uniform(-6, 6, blocks)).astype(np.float32), 64)[:size]
    return x


def pin_input(block: int = DEFAULT_BLOCK) -> np.ndarray:
    """The pinned tensor: two kernel runs, five blocks and a tail of 45 (odd), with zero and
    −0 blocks, exact ties for int8 and int4, subnormals and magnitudes from 1e-30 to 1e30."""
    rng = np.random.default_rng(20261130)
    n = 2 * C + 5 * block + 45
    x = rng.standard_normal(n).astype(np.float32)
    mags = (10.0 ** rng.uniform(-30, 30, -(-n // block))).astype(np.float32)
    x *= np.repeat(mags, block)[:n]
    x[block * 3 : block * 4] = 0.0
    x[block * 5 : block * 6] = -0.0
    ties = np.arange(-63.5, 64.5, 1.0, dtype=np.float32)
    x[block * 7 : block * 8] = ties
    x[block * 7] = 127.0
    x[block * 9 : block * 10] = ties / np.float32(127) * np.float32(7)
    x[block * 11 : block * 12 : 3] = 0.0
    x[block * 13 : block * 14] = rng.standard_normal(block).astype(np.float32) * np.float32(1e-40)
    x[block * 13] = np.float32(1e-30)
    x[block * 13 + 64] = np.float32(-1e-30)
    x[block * 15 : block * 16] = -x[block * 15 : block * 16]
    return x


# sha256(codes bytes + scales bytes), sha256(dequantized bytes) of pin_input(128) for blocks 128
# and 64, computed with the first implementation (table decoding, per-call temporaries).
PINNED = {
    ("int8", 128): (
        "15bbb829ddb5202544666c2972531185400dc011ae7fded67f7ab9fabcaddd29",
        "43f98e1557ec6b3a7fa3c929540dd64251e110d80a608f2ba8d25e8a91129a01",
    ),
    ("int8", 64): (
        "55c0b0aae6513be93ff79d3987647a8b32e4654d00890ffe29b8ab99790b2c86",
        "0e547c7a18ee9b6a06bfd4e8b05fe534f9654668b6b10d6020ab1c3c99be8f26",
    ),
    ("fp8_e4m3", 128): (
        "74fb5e6ba9bb0d1a7df31b257d532d1e05d5c4e87c05ed815a139b445324ad64",
        "ea00e65e046657aaa477f647e1bbf858ae0ac9be25cea186741e03b9e37cb730",
    ),
    ("fp8_e4m3", 64): (
        "a7b2a92c26e32c2f1a190f58e6850fe298ce32d7d4966721934148a9748ebdfb",
        "c44f3d7f78a4e63fcf2bb592634e4ed26906a0a15fe99cf11f045c6655aceec2",
    ),
    ("int4", 128): (
        "ace90eca68cf9d4730b9e544a919ed74b5cc561bbadab291cbd20ae837c19380",
        "39b0223943cea2b7ce4313de2186219514bbee1bebb596f5c5d61aebc6b5c429",
    ),
    ("int4", 64): (
        "c5e1f734cefaf43987826b35f41fbdd543df7a79026b866ca16dc6824684fc12",
        "795c64b60c077b83d004469d83e7cd1ce053041511772df99f37c1a6ced56ae1",
    ),
    ("int2", 128): (
        "f153865b8704df566c2a39c661feab4dbd617e480c15ad37d420d79791319289",
        "d55f2a08ee53444eebfc5f9fb99a8aecbbcea6aa4de3212429af0d32ab402cdf",
    ),
    ("int2", 64): (
        "c2206c8aaf7631d7494c87fce1e02d3438cf6c0d8e25778a7218d3958b735e0f",
        "e01a1175c1efe0b6b6c2d09f847e5ae85dd61517f92e77914d471ea9af0f7587",
    ),
}


@pytest.mark.parametrize(("form", "block"), sorted(PINNED))
def test_pinned_bytes(form, block):
    x = pin_input()
    codec = Codec(form, block)
    codes, scales = quantize(x, codec)
    deq = dequantize(codes, scales, codec, x.shape)
    assert np.isfinite(deq).all()
    assert hashlib.sha256(codes.tobytes() + scales.tobytes()).hexdigest() == PINNED[(form, block)][0]
    assert hashlib.sha256(deq.tobytes()).hexdigest() == PINNED[(form, block)][1]


# Hand-checked: 8 values, block 8; the codes, as bytes, and the scale.
HAND = {
    # absmax 127: scale 1, codes rint(x) (ties to even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2)
    "int8": ([127, -127, 0.5, 1.5, 2.5, -0.5, -1.49, 100.2], [127, 129, 0, 2, 2, 0, 255, 100], 1.0),
    # absmax 7: scale 1; nibble = rint(x) + 8, low nibble first: 15,1 8,10 6,11 8,15
    "int4": ([7, -7, 0.5, 1.5, -2.5, 3.4, -0.0, 6.6], [0x1F, 0xA8, 0xB6, 0xF8], 1.0),
    # absmax 1.5: scale 1; crumb = clip(floor(x) + 2, 0, 3): 3,0,2,1 3,1,2,2, first in the low bits
    "int2": ([1.5, -1.5, 0.2, -0.2, 1.0, -1.0, 0.999, 0.0], [0x63, 0xA7], 1.0),
    # absmax 448: scale 1; e4m3: 448 = 0x7E, 1 = 0x38, −0 = 0x80, 2⁻⁹ = 0x01, 17 -> 16 (tie to
    # even) = 0x58, 2⁻¹⁰ -> 0 (tie to even), 240 = 0x77
    "fp8_e4m3": ([448, -448, 1, -0.0, 2.0**-9, 17, 2.0**-10, 240], [0x7E, 0xFE, 0x38, 0x80, 0x01, 0x58, 0x00, 0x77], 1.0),
}


@pytest.mark.parametrize("form", FORMATS)
def test_hand_checked(form):
    values, expected, scale = HAND[form]
    codec = Codec(form, 8)
    x = np.array(values, np.float32)
    codes, scales = quantize(x, codec)
    assert codes.dtype == codec.code_dtype and codes.view(np.uint8).tolist() == expected
    assert scales.tolist() == [scale]
    deq = dequantize(codes, scales, codec, x.shape)
    grid = {
        "int8": [127, -127, 0, 2, 2, 0, -1, 100],
        "int4": [7, -7, 0, 2, -2, 3, 0, 7],
        "int2": [1.5, -1.5, 0.5, -0.5, 1.5, -0.5, 0.5, 0.5],
        "fp8_e4m3": [448, -448, 1, 0, 2.0**-9, 16, 0, 240],
    }[form]
    assert deq.tolist() == grid


def test_hand_checked_scale():
    """absmax 1: scale fp32(1/127), inverse 127; −63.5 is a tie (to even: −64)."""
    x = np.array([1.0, -0.5, 0.25, 0, 0, 0, 0, 0.004], np.float32)
    codes, scales = quantize(x, Codec("int8", 8))
    assert codes.tolist() == [127, -64, 32, 0, 0, 0, 0, 1]
    assert scales[0] == np.float32(1) / np.float32(127)


def reference(x: np.ndarray, codec: Codec) -> tuple[np.ndarray, np.ndarray]:
    """The first implementation's algorithm, whole tensor at once (for finite inputs whose
    blocks have absmax 0 or ≥ 2⁻¹¹⁹)."""
    flat = x.reshape(-1).astype(np.float32)
    n, block, per = flat.size, codec.block, codec.per_byte
    padded = np.zeros(-(-n // block) * block, np.float32)
    padded[:n] = flat
    rows = padded.reshape(-1, block)
    absmax = np.max(np.abs(rows), axis=1)
    scales = absmax / np.float32(codec.qmax)
    with np.errstate(divide="ignore"):
        inverse = np.where(absmax > 0, np.float32(codec.qmax) / absmax, np.float32(0)).astype(np.float32)
    y = (rows * inverse[:, None]).reshape(-1)[: -(-n // per) * per]
    if codec.format == "fp8_e4m3":
        return y.astype(FP8), scales
    if codec.format == "int2":
        q = np.clip(np.floor(y) + np.float32(2), 0, 3).astype(np.uint8).reshape(-1, 4)
        return q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6), scales
    q = np.rint(y)
    if codec.format == "int8":
        return q.astype(np.int8), scales
    nibbles = (q + np.float32(8)).astype(np.uint8).reshape(-1, 2)
    return nibbles[:, 0] | (nibbles[:, 1] << 4), scales


def table_decode(codes: np.ndarray, scales: np.ndarray, codec: Codec, numel: int) -> np.ndarray:
    """Reference dequantization: each byte's grid values from a 256-entry table, times the scale."""
    byte = np.arange(256)
    if codec.format == "int4":
        table = np.stack([(byte & 0xF) - 8.0, (byte >> 4) - 8.0], axis=1)
    elif codec.format == "int2":
        table = np.stack([((byte >> (2 * i)) & 3) - 1.5 for i in range(4)], axis=1)
    elif codec.format == "int8":
        table = byte.astype(np.uint8).view(np.int8).astype(np.float64)[:, None]
    else:
        table = byte.astype(np.uint8).view(FP8).astype(np.float32)[:, None]
    values = table.astype(np.float32)[codes.view(np.uint8)].reshape(-1)[:numel]
    return values * np.repeat(scales, codec.block)[:numel]


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("block", [8, 64, 128, 1024])
def test_matches_reference(form, block):
    codec = Codec(form, block)
    x = gaussian(C + 3 * block + 5, seed=block)
    x[: 4 * block : 3] = 0.0
    x[block : 2 * block] = 0.0
    x[2 * block : 3 * block] = -0.0
    x[5 * block + 1] = np.float32(3e-41)  # a subnormal among normal values
    codes, scales = quantize(x, codec)
    ref_codes, ref_scales = reference(x, codec)
    assert codes.view(np.uint8).tobytes() == ref_codes.view(np.uint8).tobytes()
    assert scales.tobytes() == ref_scales.tobytes()
    deq = dequantize(codes, scales, codec, x.shape)
    assert deq.tobytes() == table_decode(codes, scales, codec, x.size).tobytes()


@pytest.mark.parametrize("form", FORMATS)
def test_every_byte_decodes_as_the_table(form):
    """All 256 byte values in every position of a block, with assorted scales (0, subnormal,
    huge, negative), through the kernels and the short-block path; NaN codes stay NaN."""
    codec = Codec(form, 64)
    rng = np.random.default_rng(3)
    per_block = codec.block // codec.per_byte
    raw = np.concatenate([rng.permutation(256).astype(np.uint8) for _ in range(40)])
    numel = raw.size * codec.per_byte - 5  # ends in a short block
    raw = raw[: codec.code_count(numel)]
    scales = (10.0 ** rng.uniform(-30, 30, codec.scale_count(numel))).astype(np.float32)
    scales[:4] = [0.0, 1e-44, 3e38, -2.0]
    assert raw.size // per_block >= 4
    codes = raw.view(codec.code_dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = table_decode(codes, scales, codec, numel)
    deq = dequantize(codes, scales, codec, (numel,))
    assert deq.view(np.uint32).tolist() == expected.view(np.uint32).tolist()


def e4m3_cases() -> np.ndarray:
    """Every e4m3 value, the midpoints between neighbours (ties) and the fp32 values either side
    of each, and a stride through all fp32 values of magnitude ≤ 464, both signs."""
    grid = np.arange(256, dtype=np.uint16).astype(np.uint8).view(FP8).astype(np.float32)
    grid = np.unique(np.abs(grid[np.isfinite(grid)]))
    mids = ((grid[1:].astype(np.float64) + grid[:-1]) / 2).astype(np.float32)
    points = np.concatenate([grid, mids, [np.float32(464), np.float32(2.0**-10)]])
    near = np.concatenate(
        [points, np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(0)), points * np.float32(1 + 2**-20)]
    )
    stride = np.arange(0, 0x43E80001, 1009, dtype=np.uint32).view(np.float32)
    cases = np.concatenate([near, stride]).astype(np.float32)
    cases = cases[cases <= 464]
    return np.concatenate([cases, -cases])


def test_fp8_codes_equal_ml_dtypes_cast():
    """With a block maximum of 448 the scale is 1 and every code is ml_dtypes' cast of the value."""
    cases = e4m3_cases()
    block = 128
    per = block - 1
    rows = -(-cases.size // per)
    x = np.zeros((rows, block), np.float32)
    x[:, 0] = 448.0
    x[:, 1:].reshape(-1)[: cases.size] = cases
    codes, scales = quantize(x, Codec("fp8_e4m3", block))
    assert (scales == 1).all()
    assert codes.view(np.uint8).tobytes() == x.reshape(-1).astype(FP8).view(np.uint8).tobytes()


BOUNDS = {"int8": 0.5, "int4": 0.5, "int2": 0.5}
"""|x − deq| ≤ bound · scale per element (plus fp32 rounding): half a grid step for the integer
grids; int2's cells are [k, k+1) around k + 0.5, and |x / scale| ≤ 1.5 keeps every value in them.
fp8: |x − deq| ≤ max(2⁻⁴ |x|, 2⁻¹⁰ scale), half an e4m3 step (3 mantissa bits; subnormal step 2⁻⁹)."""


def assert_within_bound(x: np.ndarray, deq: np.ndarray, scales: np.ndarray, codec: Codec) -> None:
    flat, got = x.reshape(-1).astype(np.float64), deq.reshape(-1).astype(np.float64)
    scale = np.repeat(scales.astype(np.float64), codec.block)[: flat.size]
    error = np.abs(flat - got)
    slack = 1e-6 * np.abs(flat) + 1e-6 * scale
    if codec.format == "fp8_e4m3":
        bound = np.maximum(2.0**-4 * np.abs(flat), 2.0**-10 * scale)
    else:
        bound = BOUNDS[codec.format] * scale
    assert (error <= bound + slack).all(), float(np.max(error - bound))


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("size", SIZES)
def test_round_trip_sizes(form, size):
    codec = Codec(form)
    x = gaussian(size, seed=size)
    codes, scales = quantize(x, codec)
    assert codes.dtype == codec.code_dtype and codes.shape == (codec.code_count(size),)
    assert scales.dtype == np.float32 and scales.shape == (codec.scale_count(size),)
    assert codes.nbytes + scales.nbytes == codec.nbytes(size)
    deq = dequantize(codes, scales, codec, x.shape)
    assert deq.dtype == np.float32 and deq.shape == x.shape and deq.flags.writeable
    assert_within_bound(x, deq, scales, codec)
    if size:  # each block's largest value comes back (up to fp32 rounding of the scale)
        peaks = np.abs(x[: size // codec.block * codec.block].reshape(-1, codec.block)).argmax(axis=1)
        rows = np.arange(peaks.size) * codec.block + peaks
        np.testing.assert_allclose(np.abs(deq[rows]), np.abs(x[rows]), rtol=1e-6)


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_shapes(form, shape):
    codec = Codec(form, 64)
    x = gaussian(int(np.prod(shape)), seed=len(shape)).reshape(shape)
    codes, scales = quantize(x, codec)
    deq = dequantize(codes, scales, codec, shape)
    assert deq.shape == shape
    assert_within_bound(x, deq, scales, codec)
    # a non-contiguous view quantizes as its contiguous copy
    view = np.asfortranarray(x)
    assert quantize(view, codec)[0].tobytes() == codes.tobytes()


@pytest.mark.parametrize("form", FORMATS)
def test_zero_blocks(form):
    codec = Codec(form)
    x = gaussian(5 * codec.block + 9)
    x[codec.block : 3 * codec.block] = 0.0
    x[3 * codec.block : 4 * codec.block] = -0.0
    x[5 * codec.block :] = 0.0  # the short last block
    codes, scales = quantize(x, codec)
    assert scales[1:4].view(np.uint32).tolist() == [0, 0, 0] and scales[5] == 0 and not np.signbit(scales[5])
    zero_byte = {"int8": 0, "int4": 0x88, "int2": 0xAA, "fp8_e4m3": 0}[form]
    raw = codes.view(np.uint8)
    per = codec.block // codec.per_byte
    assert (raw[per : 3 * per] == zero_byte).all()
    assert (raw[3 * per : 4 * per] == (0x80 if form == "fp8_e4m3" else zero_byte)).all()
    deq = dequantize(codes, scales, codec, x.shape)
    assert (deq[codec.block : 4 * codec.block] == 0).all() and (deq[5 * codec.block :] == 0).all()


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_block_stays_non_finite(form, bad):
    codec = Codec(form)
    x = gaussian(C + 3 * codec.block + 5)
    clean_codes, clean_scales = quantize(x, codec)
    clean = dequantize(clean_codes, clean_scales, codec, x.shape)
    hit = [5, C // codec.block + 1, C // codec.block + 3]  # a block in each run and the short last one
    for row in hit:
        x[row * codec.block + 3] = bad
    codes, scales = quantize(x, codec)
    deq = dequantize(codes, scales, codec, x.shape)
    finite = np.ones(x.size, bool)
    for row in hit:
        finite[row * codec.block : (row + 1) * codec.block] = False
        assert not np.isfinite(scales[row])
    assert not np.isfinite(deq[~finite]).any()
    assert deq[finite].tobytes() == clean[finite].tobytes()


@pytest.mark.parametrize("form", FORMATS)
def test_tiny_blocks_stay_finite(form):
    """A block whose largest magnitude is below ~2⁻¹¹⁹ (qmax / absmax overflows fp32) still
    quantizes to finite values within the bound: it is scaled up before rounding."""
    codec = Codec(form, 64)
    x = gaussian(4 * codec.block + 10)
    x[codec.block : 2 * codec.block] *= np.float32(1e-40) / np.abs(x[codec.block : 2 * codec.block]).max()
    x[-10:] = np.float32(3e-39) * np.linspace(-1, 1, 10, dtype=np.float32)  # in the short last block
    codes, scales = quantize(x, codec)
    deq = dequantize(codes, scales, codec, x.shape)
    assert np.isfinite(deq).all()
    tiny = np.abs(x[codec.block : 2 * codec.block]).max()
    assert np.abs(deq - x)[codec.block : 2 * codec.block].max() <= tiny  # no worse than zeroing the block
    assert_within_bound(x[: codec.block], deq[: codec.block], scales[:1], codec)


@pytest.mark.parametrize("form", FORMATS)
def test_thread_count_independent(form, threads):
    codec = Codec(form)
    x = gaussian(3 * C + 77, seed=7)
    threads(1)
    one = quantize(x, codec)
    deq_one = dequantize(*one, codec, x.shape)
    for count in (2, 3):
        threads(count)
        many = quantize(x, codec)
        assert many[0].tobytes() == one[0].tobytes() and many[1].tobytes() == one[1].tobytes()
        assert dequantize(*many, codec, x.shape).tobytes() == deq_one.tobytes()


def test_dequantize_rejects_wrong_arrays():
    codec = Codec("int4")
    x = gaussian(300)
    codes, scales = quantize(x, codec)
    with pytest.raises(ValueError, match=r"codes are int8\[150\].*needs uint8\[150\]"):
        dequantize(codes.view(np.int8), scales, codec, x.shape)
    with pytest.raises(ValueError, match=r"codes are uint8\[149\]"):
        dequantize(codes[:-1], scales, codec, x.shape)
    with pytest.raises(ValueError, match=r"codes are uint8\[2, 75\]"):
        dequantize(codes.reshape(2, 75), scales, codec, x.shape)
    with pytest.raises(ValueError, match=r"scales are float64\[3\].*needs float32\[3\]"):
        dequantize(codes, scales.astype(np.float64), codec, x.shape)
    with pytest.raises(ValueError, match=r"scales are float32\[2\]"):
        dequantize(codes, scales[:2], codec, x.shape)
    with pytest.raises(ValueError, match=r"scales are float32\[3, 1\]"):
        dequantize(codes, scales.reshape(3, 1), codec, x.shape)
    with pytest.raises(ValueError, match=r"int4/128 of 301 elements needs uint8\[151\]"):
        dequantize(codes, scales, codec, (301,))
    fp8 = Codec("fp8_e4m3")
    fp8_codes, fp8_scales = quantize(x, fp8)
    with pytest.raises(ValueError, match=r"codes are uint8\[300\].*needs float8_e4m3fn\[300\]"):
        dequantize(fp8_codes.view(np.uint8), fp8_scales, fp8, x.shape)


@pytest.mark.parametrize("block", [0, 4, 7, 12, 3 * 128, 2 * C, -8, True, 128.0, "128"])
def test_codec_rejects_bad_block(block):
    with pytest.raises(ValueError, match="quantization block"):
        Codec("int8", block)


@pytest.mark.parametrize("form", ["int3", "fp8", "INT8", "", "fp8_e5m2"])
def test_codec_rejects_bad_format(form):
    with pytest.raises(ValueError, match="unknown quantization format"):
        Codec(form)  # type: ignore[arg-type]


def test_codec_properties():
    expected = {
        "int8": (1, np.int8, 127.0),
        "fp8_e4m3": (1, FP8, 448.0),
        "int4": (2, np.uint8, 7.0),
        "int2": (4, np.uint8, 1.5),
    }
    assert set(FORMATS) == set(expected) and DEFAULT_BLOCK == 128
    for form, (per_byte, dtype, qmax) in expected.items():
        codec = Codec(form)
        assert (codec.per_byte, codec.code_dtype, codec.qmax, codec.block) == (per_byte, np.dtype(dtype), qmax, 128)
        assert codec.code_count(0) == 0 and codec.code_count(1) == 1 and codec.code_count(9) == -(-9 // per_byte)
        assert codec.scale_count(129) == 2 and codec.nbytes(256) == 256 // per_byte + 8


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("block", [8, 64, 128, C])
def test_codec_parse_round_trip(form, block):
    codec = Codec(form, block)
    assert codec.name == f"{form}/{block}"
    assert Codec.parse(codec.name) == codec


@pytest.mark.parametrize("name", ["int8", "int8/", "int8/x", "int8/-8", "int8/1e2", "/128", "int9/128", "int8/100", "int8/128/1"])
def test_codec_parse_rejects(name):
    with pytest.raises(ValueError, match="quantization"):
        Codec.parse(name)


@pytest.mark.parametrize("form", FORMATS)
def test_feedback_residual_is_exact(form):
    codec = Codec(form)
    delta = gaussian(C + 200, seed=1).reshape(-1, 8)
    residual = gaussian(C + 200, seed=2).reshape(-1, 8) * np.float32(1e-3)
    codes, scales, left = quantize_with_feedback(delta, residual, codec)
    target = delta + residual
    deq = dequantize(codes, scales, codec, delta.shape)
    assert left.shape == delta.shape and left.dtype == np.float32
    assert (target - deq).tobytes() == left.tobytes()
    codes0, scales0, left0 = quantize_with_feedback(delta, None, codec)
    assert (delta - dequantize(codes0, scales0, codec, delta.shape)).tobytes() == left0.tobytes()


@pytest.mark.parametrize("form", FORMATS)
def test_feedback_carries_what_was_lost(form):
    """Σ dequantized deltas + the last residual = Σ deltas, to fp32 accumulation tolerance."""
    codec = Codec(form)
    rng = np.random.default_rng(5)
    residual = None
    sent = np.zeros(5000, np.float64)
    total = np.zeros(5000, np.float64)
    for _ in range(12):
        delta = rng.standard_normal(5000).astype(np.float32)
        codes, scales, residual = quantize_with_feedback(delta, residual, codec)
        sent += dequantize(codes, scales, codec, delta.shape)
        total += delta
    assert residual is not None
    np.testing.assert_allclose(sent + residual, total, rtol=0, atol=1e-5 * np.abs(total).max())


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_compact_update_is_what_a_learner_rebuilds(form, dtype):
    codec = Codec(form)
    rng = np.random.default_rng(11)
    old = rng.standard_normal((7, C // 7 + 5)).astype(np.float32).astype(dtype)
    target = old.astype(np.float32) + rng.standard_normal(old.shape).astype(np.float32) * np.float32(0.01)
    (codes, scales), committed = compact_update(old, target, codec)
    assert committed.dtype == old.dtype and committed.shape == old.shape
    rebuilt = apply_update(old, (codes, scales), codec)
    assert rebuilt.dtype == old.dtype and rebuilt.tobytes() == committed.tobytes()
    update = dequantize(codes, scales, codec, old.shape)
    assert (old.astype(np.float32) + update).astype(dtype).tobytes() == committed.tobytes()
    assert_within_bound(target - old.astype(np.float32), update, scales, codec)
