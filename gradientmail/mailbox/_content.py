"""Payload checks and content-derived version tokens shared by the local stores."""

from __future__ import annotations

import hashlib
from typing import BinaryIO

__all__ = ["as_payload", "as_token", "content_token", "stream_token"]

_CHUNK_BYTES = 4 * 1024 * 1024


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
    """Token of a payload: its SHA-256. Like an ETag, it changes whenever the bytes do and
    cannot be reused by an unrelated write, unlike an inode number or a timestamp."""
    return hashlib.sha256(data).hexdigest()


def stream_token(stream: BinaryIO) -> tuple[int, str]:
    """Size and :func:`content_token` of everything left in ``stream``, read in chunks."""
    digest = hashlib.sha256()
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
