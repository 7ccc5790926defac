"""Blobs at their keys, verified: what a record references by size and digest.

Tensor payloads (contributions, committed parameters and outer state, compact updates) and
learner states are blobs; a record pins each by ``PayloadRef`` (key, size, digest, and the
encoding of a compressed one). Blobs are written under the run's digest (``RunSpec.blob_digest``:
BLAKE3 for new runs, sha256 for runs from before manifests named one) and read back checked by
the digest their reference names, so both kinds of run stay readable. Nothing read is returned
before its size and digest matched, and no more than the record says is fetched (INV-13); a
store that hashes while it moves the bytes (``HashingGet``/``HashingPut``) hands the digest over
instead of it being taken again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gradientmail.backends import lossless, payload
from gradientmail.digests import DigestName, hex_digest
from gradientmail.errors import CorruptPayload, GradientMailError, IncompatiblePayload, KeyNotFound, ObjectTooLarge
from gradientmail.mailbox import Mailbox
from gradientmail.mailbox.base import Gathered, HashingGet, HashingPut, joined
from gradientmail.records import PayloadRef
from gradientmail.store.spec import TensorShape

__all__ = ["Arrays", "Blobs", "check_tensors", "pins", "sha256_hex", "typesize"]

Arrays = dict[str, np.ndarray]
"""Named host arrays: what crosses the store's boundary in both directions."""


def sha256_hex(data: bytes) -> str:
    """The sha256 of a record's stored bytes (the chain's ``previous``, the head's pointer)."""
    return hashlib.sha256(data).hexdigest()


def _digest_matches(ref: PayloadRef, data: bytes, hexdigest: str | None) -> bool:
    """Whether ``data``'s digest by ``ref``'s kind is ``ref``'s (``hexdigest``: taken already by the store)."""
    return (hexdigest if hexdigest is not None else hex_digest(ref.digest_name, data)) == ref.hexdigest


def pins(ref: PayloadRef, data: bytes) -> bool:
    """Whether ``data`` is exactly the raw blob ``ref`` pins: its size and its digest."""
    return len(data) == ref.size_bytes and _digest_matches(ref, data, None)


def _checked(ref: PayloadRef, data: bytes, hexdigest: str | None = None) -> bytes:
    """``data`` if it is the blob ``ref`` pins; ``CorruptPayload`` naming what differs otherwise."""
    if len(data) != ref.size_bytes:
        raise CorruptPayload(f"{ref.key}: {len(data)} bytes, the record says {ref.size_bytes}")
    if not _digest_matches(ref, data, hexdigest):
        raise CorruptPayload(f"{ref.key}: checksum mismatch")
    return data


class Blobs:
    """One run's blobs in one mailbox (``RunStore.blobs``)."""

    def __init__(self, mailbox: Mailbox, digest: DigestName | None = None) -> None:
        self._mailbox = mailbox
        self._digest = digest

    @property
    def digest(self) -> DigestName:
        """What new blobs are pinned by: the run's ``blob_digest``. ``RunStore`` sets it from the
        manifest it verifies or creates; writing before that is an error, never a guess."""
        if self._digest is None:
            raise GradientMailError(
                f"{self._mailbox.url}: the run's blob digest is not known yet (read or create its manifest before writing blobs)"
            )
        return self._digest

    @digest.setter
    def digest(self, name: DigestName) -> None:
        self._digest = name

    def write_tensors(
        self,
        key: str,
        tensors: Mapping[str, np.ndarray],
        hashing: ThreadPoolExecutor | None = None,
        *,
        compress: bool = False,
        digest: DigestName | None = None,
    ) -> PayloadRef:
        """Put a blob of ``tensors``, its pieces gathered (no encoded copy where the store writes
        pieces); with ``hashing``, its digest is taken there while it uploads; ``compress``: stored
        as zstd-shuffle frames, shuffled by the element size that holds most of the bytes;
        ``digest``: what it is pinned by (None: the run's)."""
        pieces = Gathered(payload.encode_pieces(tensors))
        if not compress:
            return self.put(key, pieces, hashing, digest=digest)
        return self.put_compressed(key, joined(pieces), typesize(tensors.values()), hashing, digest=digest)

    def put_compressed(
        self, key: str, raw: bytes, typesize: int, hashing: ThreadPoolExecutor | None = None, *, digest: DigestName | None = None
    ) -> PayloadRef:
        """Put ``raw`` compressed (``backends/lossless.py``); the reference pins the raw bytes
        (by ``digest``; None: the run's)."""
        name = digest or self.digest
        taken = hashing.submit(hex_digest, name, raw) if hashing is not None else None
        stored = lossless.compress(raw, typesize)
        self._mailbox.put(key, stored)
        hexdigest = taken.result() if taken is not None else hex_digest(name, raw)
        return PayloadRef.pinned(key, name, hexdigest, len(raw), encoding=lossless.ENCODING, stored_bytes=len(stored))

    def put(
        self, key: str, data: bytes | Gathered, hashing: ThreadPoolExecutor | None = None, *, digest: DigestName | None = None
    ) -> PayloadRef:
        """Put a blob and reference it by size and ``digest`` (None: the run's). A store that
        hashes what it writes (``HashingPut``) hands the digest over, and writes a gathered
        payload out of its pieces: the bytes are hashed once and never joined. Any other gets
        them joined and hashes them here, on ``hashing`` while the upload runs when given."""
        mailbox, name = self._mailbox, digest or self.digest
        if isinstance(mailbox, HashingPut):
            _, hexdigest = mailbox.put_hashed(key, data, name)
            return PayloadRef.pinned(key, name, hexdigest, len(data))
        data = joined(data)
        taken = hashing.submit(hex_digest, name, data) if hashing is not None else None
        try:
            self._mailbox.put(key, data)
        finally:
            hexdigest = taken.result() if taken is not None else hex_digest(name, data)
        return PayloadRef.pinned(key, name, hexdigest, len(data))

    def read(self, ref: PayloadRef) -> bytes:
        """A referenced blob's bytes, after checking its size and checksum (``CorruptPayload``).
        No more than the record's ``size_bytes`` is fetched from a larger object. A store that
        hashes while it downloads (``HashingGet``) hands the digest over with the bytes; any
        other is hashed here. Either way nothing is returned before its digest matched."""
        mailbox = self._mailbox
        if ref.encoding is not None:
            return self._read_compressed(ref)
        try:
            if isinstance(mailbox, HashingGet):
                data, digest = mailbox.get_hashed(ref.key, ref.digest_name, max_bytes=ref.size_bytes)
            else:
                data = mailbox.get(ref.key, max_bytes=ref.size_bytes)
                digest = None
        except ObjectTooLarge as exc:
            raise CorruptPayload(f"{ref.key}: larger than the {ref.size_bytes} bytes its record says ({exc})") from None
        return _checked(ref, data, digest)

    def _read_compressed(self, ref: PayloadRef) -> bytes:
        """A compressed blob's raw bytes: no more fetched than the codec's worst case for the
        declared size, no frame decoded past it (INV-13), the raw bytes checked by their digest."""
        bound = lossless.stored_bound(ref.size_bytes)
        try:
            stored = self._mailbox.get(ref.key, max_bytes=bound)
        except ObjectTooLarge as exc:
            raise CorruptPayload(f"{ref.key}: larger than {bound} bytes, the most {ref.size_bytes} compress to ({exc})") from None
        try:
            data = lossless.decompress(stored, ref.size_bytes)
        except lossless.LosslessError as exc:
            raise CorruptPayload(f"{ref.key}: {exc}") from None
        return _checked(ref, data)

    def intact(self, ref: PayloadRef) -> bool:
        """Whether the blob ``ref`` names is there with its size and checksum (one read)."""
        try:
            self.read(ref)
        except (KeyNotFound, CorruptPayload):
            return False
        return True

    def restore(self, ref: PayloadRef, data: bytes) -> None:
        """Write ``data`` back at ``ref.key`` if it is exactly the bytes ``ref`` pins (size and
        digest); ``CorruptPayload`` otherwise, and nothing is written."""
        if not pins(ref, data):
            raise CorruptPayload(f"{ref.key}: the recomputed bytes differ from those its record pins")
        # the record pins the raw bytes: any compressor's frames of them read back the same
        self._mailbox.put(ref.key, data if ref.encoding is None else lossless.compress(data, 4))

    def read_tensors(self, ref: PayloadRef, expected: Mapping[str, TensorShape] | None = None) -> Arrays:
        """Fetch a blob and verify size, checksum, and (if given) names, shapes and dtypes.

        Raises ``CorruptPayload`` for a size/checksum/decoding failure and
        ``IncompatiblePayload`` for tensors that do not match ``expected``.
        """
        tensors, _ = payload.decode(self.read(ref))
        if expected is not None:
            check_tensors(tensors, expected, ref.key)
        return tensors


def check_tensors(tensors: Mapping[str, np.ndarray], expected: Mapping[str, TensorShape], where: str) -> None:
    """Raise ``IncompatiblePayload`` unless the names, shapes and dtypes are the expected ones."""
    if set(tensors) != set(expected):
        missing = sorted(set(expected) - set(tensors))
        extra = sorted(set(tensors) - set(expected))
        raise IncompatiblePayload(f"{where}: tensor names differ (missing {missing}, unexpected {extra})")
    for name, spec in expected.items():
        shape = tuple(int(d) for d in tensors[name].shape)
        if shape != tuple(spec.shape):
            raise IncompatiblePayload(f"{where}: {name} has shape {shape}, expected {tuple(spec.shape)}")
        dtype = payload.dtype_name_of(tensors[name])
        if spec.dtype is not None and dtype != spec.dtype:
            raise IncompatiblePayload(f"{where}: {name} has dtype {dtype}, expected {spec.dtype}")


def typesize(arrays: Iterable[np.ndarray]) -> int:
    """The element size that holds most of a blob's bytes: what its byte shuffle groups by."""
    by_size: dict[int, int] = {}
    for array in arrays:
        by_size[array.dtype.itemsize] = by_size.get(array.dtype.itemsize, 0) + array.nbytes
    return max(by_size, key=lambda size: by_size[size]) if by_size else 1
