"""The blob digests a run may name: sha256 (runs from before manifests named one) and BLAKE3 (new runs).

A record pins each blob it references by size and digest (``PayloadRef``); the run's manifest
names which digest its writers use (``Manifest.blob_digest``; absent: sha256), and every reader
checks a blob by the digest its reference carries, so runs of both kinds stay readable,
replayable and auditable. Both are cryptographic hashes with 256-bit output (64 hex digits);
BLAKE3 (the ``blake3`` package, its reference implementation in Rust) hashes 2.1x faster than
sha256 with SHA-NI on one core of the 2-core VM of ``docs/benchmarks.md`` (3.3 against 1.56 GB/s),
and both release the GIL, so the transfer threads hash in parallel. Records themselves (the
chain's ``previous``, the head's ``record_sha256``) and the run key's MACs stay sha256.

Every hash of a blob in the package is made here (:func:`new_hasher`), so a third digest is one
entry in :data:`DIGESTS`.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final, Literal, Protocol, get_args

import blake3

__all__ = [
    "DEFAULT_BLOB_DIGEST",
    "DIGESTS",
    "LEGACY_BLOB_DIGEST",
    "DigestName",
    "Hasher",
    "check_digest_name",
    "hex_digest",
    "new_hasher",
]

DigestName = Literal["sha256", "blake3"]
"""A blob digest, by the name records and manifests carry."""

DIGESTS: Final[tuple[DigestName, ...]] = get_args(DigestName)

DEFAULT_BLOB_DIGEST: Final[DigestName] = "blake3"
"""What a new run's manifest names (docs/protocol.md, "Integrity", has the measurement)."""

LEGACY_BLOB_DIGEST: Final[DigestName] = "sha256"
"""What a manifest that names no digest means: every run written before ``blob_digest`` existed."""


class Hasher(Protocol):
    """What a hash offers (``hashlib`` and ``blake3`` alike): fed in order, asked for its digest."""

    def update(self, data: Any, /) -> Any: ...

    def digest(self) -> bytes: ...

    def hexdigest(self) -> str: ...


def check_digest_name(name: object) -> DigestName:
    """``name`` if it is a digest this package knows; ``ValueError`` naming the known ones."""
    if name not in DIGESTS:
        raise ValueError(f"unknown blob digest {name!r}: expected one of {', '.join(DIGESTS)}")
    return name


def new_hasher(name: DigestName) -> Hasher:
    """A fresh hash of kind ``name``, single-threaded (the transfer threads are the parallelism:
    a hash that spread itself over the cores would compete with them on a small machine)."""
    if name == "sha256":
        return hashlib.sha256()
    if name == "blake3":
        return blake3.blake3()
    raise ValueError(f"unknown blob digest {name!r}: expected one of {', '.join(DIGESTS)}")


def hex_digest(name: DigestName, data: bytes | bytearray | memoryview) -> str:
    """The hex digest of ``data`` of kind ``name``, as records carry it."""
    hasher = new_hasher(name)
    hasher.update(data)
    return hasher.hexdigest()
