"""Payload checks and content-derived version tokens shared by the local stores."""

from __future__ import annotations

import operator
from typing import BinaryIO, Final, SupportsIndex

from gradientmail.digests import DigestName, new_hasher
from gradientmail.errors import ObjectTooLarge

__all__ = [
    "TOKEN_DIGEST",
    "as_max_bytes",
    "as_payload",
    "as_token",
    "content_token",
    "read_at_most",
    "stream_token",
    "too_large",
]

_CHUNK_BYTES = 4 * 1024 * 1024

TOKEN_DIGEST: Final[DigestName] = "blake3"
"""The hash of the local stores' version tokens: BLAKE3, the digest of new runs' blobs, so a blob
of such a run is hashed once for its token and its reference alike (``put_hashed``)."""


def as_payload(data: bytes) -> bytes:
    """Return ``data`` as immutable ``bytes`` (copying a bytearray or memoryview).

    Raises:
        TypeError: ``data`` is not bytes-like; payloads are never str.
    """
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"mailbox payloads are bytes, not {type(data).__name__}")


def content_token(data: bytes) -> str:
    """Token of a payload: its :data:`TOKEN_DIGEST`. Like an ETag, it changes whenever the bytes
    do and cannot be reused by an unrelated write, unlike an inode number or a timestamp. Tokens
    never leave the process that read them (no record holds one), so a node computes and
    compares its own."""
    hasher = new_hasher(TOKEN_DIGEST)
    hasher.update(data)
    return hasher.hexdigest()


def stream_token(stream: BinaryIO) -> tuple[int, str]:
    """Size and :func:`content_token` of everything left in ``stream``, read in chunks."""
    digest = new_hasher(TOKEN_DIGEST)
    size = 0
    while chunk := stream.read(_CHUNK_BYTES):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def as_token(token: str) -> str:
    """Return ``token`` if it is a str, as every store's tokens are.

    Raises:
        TypeError: a token of another type, which no store could ever have issued.
    """
    if not isinstance(token, str):
        raise TypeError(f"version tokens are str, not {type(token).__name__}")
    return token


def as_max_bytes(max_bytes: object) -> int | None:
    """Return a reader's allowance ``max_bytes`` as an int (None: no limit).

    Checked before any I/O, so a bad allowance can never be mistaken for "no limit".

    Raises:
        TypeError: not an integer (a bool or float is refused, not rounded).
        ValueError: a negative allowance.
    """
    if max_bytes is None:
        return None
    if isinstance(max_bytes, bool):
        raise TypeError("max_bytes must be an int or None, not bool")
    if not isinstance(max_bytes, SupportsIndex):  # int, or an integer type such as numpy.int64
        raise TypeError(f"max_bytes must be an int or None, not {type(max_bytes).__name__}")
    allowance = operator.index(max_bytes)
    if allowance < 0:
        raise ValueError(f"max_bytes must be >= 0, got {allowance}")
    return allowance


def read_at_most(stream: BinaryIO, limit: int) -> bytes:
    """Read until end of stream but never more than ``limit`` bytes; a result of exactly
    ``limit`` bytes may mean there was more (callers ask for their allowance + 1)."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = stream.read(min(left, _CHUNK_BYTES))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def too_large(key: str, where: str, size: int | None, max_bytes: int) -> ObjectTooLarge:
    """The one-line error for an object over a reader's allowance; ``size`` is None when
    the store did not say (the object was cut off after ``max_bytes`` + 1 bytes)."""
    stored = f"is {size} bytes, more than" if size is not None else "is larger than"
    return ObjectTooLarge(f"mailbox key {key!r} in {where} {stored} the {max_bytes} bytes the reader allows (max_bytes)")
