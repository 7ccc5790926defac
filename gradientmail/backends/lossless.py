"""Lossless compression of a blob on the wire: zstd with byte shuffle, in Blosc frames.

The guide's own system compresses payloads with byte-shuffled zstd; measured here
(docs/benchmarks-log.md, "Lossless compression"), it saves 7–13 % of fp32 bytes and 22–29 % of bf16
at level 1, and pays on links slower than about 50 MB/s (fp32) to 100 MB/s (bf16) on two cores.
It is a transport encoding (``PayloadRef.encoding``): the record's sha256 and size are those of
the raw blob, so replay and repair compare raw bytes whatever the compressor's version wrote.

The blob is cut into frames of at most ``FRAME_BYTES`` (Blosc's buffers are bounded), each a
Blosc frame whose 16-byte header (Blosc's documented format) says its raw and compressed sizes.
A reader walks the headers and refuses, before it decompresses anything, frames whose sizes are
inconsistent or whose raw total exceeds what the record declares (INV-13: no decompression bomb).
Blosc comes from ``numcodecs`` (the ``compression`` extra).
"""

from __future__ import annotations

import struct
from typing import Any, Final

import numpy as np

from gradientmail.errors import GradientMailError, install_hint

__all__ = ["ENCODING", "FRAME_BYTES", "LosslessError", "compress", "decompress", "stored_bound"]

ENCODING: Final = "zstd-shuffle"
"""The name a record gives this encoding (``PayloadRef.encoding``)."""
FRAME_BYTES = 1 << 28
"""Raw bytes per Blosc frame (256 MiB): well under Blosc's 2 GB buffer limit, and one frame's
output is all a reader holds besides the blob."""
LEVEL = 1
"""zstd level 1: level 3 saved 3–4 points more at half the speed (docs/benchmarks-log.md)."""
_HEADER = struct.Struct("<BBBBIII")
"""Blosc 1 frame header: version, codec version, flags, typesize, raw bytes, block size, frame bytes."""
_OVERHEAD = 16
"""Blosc's most bytes over the raw size per frame (``MAX_OVERHEAD``: a frame stored uncompressed)."""


class LosslessError(GradientMailError):
    """A compressed blob that does not decode to what its record declares."""


def _blosc() -> Any:
    try:
        from numcodecs import Blosc
    except ImportError as exc:  # an optional dependency (the compression extra)
        raise GradientMailError(f"payload_compression='zstd' needs numcodecs: {install_hint('compression')}") from exc
    return Blosc(cname="zstd", clevel=LEVEL, shuffle=Blosc.SHUFFLE)


_ELEMENT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
"""Blosc shuffles by the buffer's element size: the view each frame is handed (every numcodecs
release takes it from the buffer; only recent ones also take a ``typesize`` argument)."""


def stored_bound(raw_bytes: int) -> int:
    """The most bytes a compressed blob of ``raw_bytes`` may take (every frame stored as is; a
    frame of ``FRAME_BYTES`` may end with a tail frame of its own)."""
    frames = 2 * max(1, -(-raw_bytes // FRAME_BYTES))
    return raw_bytes + frames * _OVERHEAD


def compress(data: bytes | memoryview, typesize: int) -> bytes:
    """``data`` in Blosc zstd frames, bytes shuffled by ``typesize`` (the tensors' element size)."""
    codec = _blosc()
    raw = np.frombuffer(data, np.uint8)
    element = _ELEMENT.get(typesize, np.uint8)
    size = np.dtype(element).itemsize
    frames = []
    for start in range(0, raw.size, FRAME_BYTES):
        piece = raw[start : start + FRAME_BYTES]
        whole = piece.size - piece.size % size
        frames.append(bytes(codec.encode(piece[:whole].view(element))))
        if whole < piece.size:  # a tail shorter than one element: a frame of its own, unshuffled
            frames.append(bytes(codec.encode(piece[whole:])))
    return b"".join(frames) if frames else bytes(codec.encode(raw))


def decompress(data: bytes, raw_bytes: int) -> bytes:
    """The raw blob of ``data``, exactly ``raw_bytes`` long; ``LosslessError`` naming what is wrong
    for a truncated or inconsistent frame, or frames that would decode to more (checked on the
    headers, before anything is decompressed)."""
    spans: list[tuple[int, int, int]] = []
    position, total = 0, 0
    while position < len(data) or not spans:
        if len(data) - position < _HEADER.size:
            raise LosslessError(f"a compressed frame header at byte {position} is cut short ({len(data) - position} bytes)")
        _, _, _, _, nbytes, _, cbytes = _HEADER.unpack_from(data, position)
        if cbytes < _HEADER.size or position + cbytes > len(data):
            raise LosslessError(f"the frame at byte {position} claims {cbytes} bytes, {len(data) - position} are left")
        if nbytes > FRAME_BYTES or cbytes > nbytes + _OVERHEAD:
            raise LosslessError(f"the frame at byte {position} claims {nbytes} raw bytes in {cbytes}: not one this codec writes")
        total += nbytes
        if total > raw_bytes:
            raise LosslessError(f"the frames decode to more than the {raw_bytes} bytes the record declares")
        spans.append((position, cbytes, nbytes))
        position += cbytes
    if total != raw_bytes:
        raise LosslessError(f"the frames decode to {total} bytes, the record declares {raw_bytes}")
    codec = _blosc()
    out = bytearray(raw_bytes)
    at = 0
    for start, size, nbytes in spans:
        if nbytes == 0:
            continue  # an empty blob's one frame: Blosc refuses to decode nothing
        try:
            piece = codec.decode(data[start : start + size])
        except Exception as exc:  # Blosc raises RuntimeError for a damaged frame
            raise LosslessError(f"the frame at byte {start} does not decode: {exc}") from None
        piece = memoryview(piece).cast("B")
        out[at : at + len(piece)] = piece
        at += len(piece)
    if at != raw_bytes:
        raise LosslessError(f"the frames decoded to {at} bytes, the record declares {raw_bytes}")
    return bytes(out)
