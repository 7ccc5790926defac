"""The mailbox contract: the only storage operations the GradientMail protocol needs.

A mailbox is a flat map from keys to immutable byte strings, shared by every node of a
run. Each store (memory, directory, S3) is one module beside this one and passes the same
conformance suite; nothing above this layer knows which store it talks to.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gradientmail.digests import DigestName, hex_digest, new_hasher

__all__ = [
    "ForwardingMailbox",
    "Gathered",
    "HashingGet",
    "HashingPut",
    "Mailbox",
    "ObjectInfo",
    "OPTIONAL_CAPABILITIES",
    "StampedGet",
]

Buffer = bytes | bytearray | memoryview
"""What a :class:`Gathered` payload is made of: anything with a contiguous byte buffer."""


class Gathered:
    """A payload held as pieces in order (a blob's header, then each array's own buffer), which
    a store that can writes as their concatenation without joining them first: a 256 MB
    fragment goes out of the arrays it was computed in, with no encoded copy (docs/protocol.md,
    "Integrity"). The pieces must not change until the write returns: the digest is taken
    over them while they are sent."""

    __slots__ = ("_pieces", "_size")

    def __init__(self, pieces: Iterable[Buffer]) -> None:
        views = [memoryview(piece).cast("B") for piece in pieces]
        self._pieces = tuple(view for view in views if len(view))
        self._size = sum(len(view) for view in self._pieces)

    def __len__(self) -> int:
        return self._size

    @property
    def pieces(self) -> tuple[memoryview, ...]:
        """The non-empty pieces, as byte views, in order."""
        return self._pieces

    def between(self, start: int, stop: int) -> list[memoryview]:
        """Views of the bytes ``[start, stop)`` of the concatenation, in order (no copy)."""
        views: list[memoryview] = []
        offset = 0
        for piece in self._pieces:
            end = offset + len(piece)
            if end > start and offset < stop:
                views.append(piece[max(start, offset) - offset : min(stop, end) - offset])
            offset = end
            if offset >= stop:
                break
        return views

    def join(self) -> bytes:
        """The payload as one ``bytes`` (one copy), for a store that cannot write pieces."""
        return b"".join(self._pieces)

    def digest(self, name: DigestName) -> bytes:
        """The digest ``name`` of the concatenation, fed piece by piece (both hashes release the
        GIL: parts sent meanwhile keep going)."""
        hasher = new_hasher(name)
        for piece in self._pieces:
            hasher.update(piece)
        return hasher.digest()

    def hexdigest(self, name: DigestName) -> str:
        """:meth:`digest` in hex, as records name it."""
        return self.digest(name).hex()


def joined(data: bytes | Gathered) -> bytes:
    """``data`` as one ``bytes``: itself, or a :class:`Gathered` payload joined."""
    return data.join() if isinstance(data, Gathered) else data


@dataclass(frozen=True)
class ObjectInfo:
    """What :meth:`Mailbox.head` learns about a stored object without reading it."""

    size: int
    """Length of the stored payload in bytes."""
    token: str
    """Version token of the stored payload (an S3 ETag or equivalent)."""
    modified_at: float | None = None
    """When the stored payload was written, in seconds since the epoch on the *store's* clock
    (S3's ``Last-Modified``, a file's mtime, a memory store's write time), truncated to
    ``modified_resolution_s``; None from a store that does not say. Every node reads the same
    value for the same object, which is what makes it a shared clock (``store.store_clock``)."""
    modified_resolution_s: float = 0.0
    """The step ``modified_at`` is truncated to: 1 s for S3 (an HTTP date), the file system's
    timestamp granularity for a directory, 0 for memory."""


@runtime_checkable
class Mailbox(Protocol):
    """A key/value store with create-once and compare-and-swap writes.

    Contract, for every store:

    * **Keys** are ``str`` relative to the mailbox root, checked by
      :func:`gradientmail.mailbox.validate_key` before any I/O; a bad key raises
      ``InvalidKey`` and nothing is read or written. **Payloads** are ``bytes``.
    * **Version tokens** are opaque strings. A write returns the token of what it stored;
      a token changes whenever the stored bytes change, but two writes of identical bytes
      may share a token (an S3 ETag is the MD5 of a simple upload). Records that must show
      liveness (leases) therefore carry a counter, so each renewal changes the bytes.
    * **Atomicity**: a reader sees either a whole previous payload or a whole new one,
      never a partial write; ``create`` and ``swap`` are atomic against every other write.
    * **Errors**: only ``gradientmail.errors`` types escape. ``KeyNotFound``,
      ``RecordExists`` and ``VersionConflict`` are outcomes the protocol handles;
      ``ObjectTooLarge`` refuses an object over a reader's ``max_bytes``;
      ``MailboxUnavailable`` (retryable later) means the store kept failing after the
      store's own retries; ``MailboxMisconfigured`` means the user must fix something
      (bucket, credentials, a store without conditional writes).
    * ``close()`` releases connections and threads; it is idempotent, and a closed
      mailbox reopens them if it is used again.
    """

    @property
    def url(self) -> str:
        """The URL form (``s3://…``, ``file:///…``, ``memory://…``) that
        :func:`gradientmail.mailbox.open_mailbox` turns back into an equivalent mailbox.
        It never contains secrets."""
        ...

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """Return the stored bytes. Raises ``KeyNotFound`` if the key is absent.

        ``max_bytes`` is the most the caller will accept. Anyone who can write to the
        mailbox can store an object of any size, and a reader that fetched it whole before
        looking would let such a writer exhaust its memory or bandwidth; so a store learns
        the size first (``Content-Range`` of one ranged GET, ``fstat``) and, when the object
        is larger, raises ``ObjectTooLarge`` having read at most about ``max_bytes`` bytes.
        None (the default) reads any size. ``TypeError``/``ValueError`` for an allowance
        that is not a non-negative int, before any I/O.
        """
        ...

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """Return the stored bytes and the token of exactly those bytes (for a later
        :meth:`swap`). Raises ``KeyNotFound`` if the key is absent, and ``ObjectTooLarge``
        if it holds more than ``max_bytes`` bytes (see :meth:`get`)."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """Return size and token of the stored object, or None if it is absent."""
        ...

    def exists(self, key: str) -> bool:
        """True when the key holds an object."""
        ...

    def put(self, key: str, data: bytes) -> str:
        """Store ``data`` under ``key``, replacing any previous object; return its token."""
        ...

    def create(self, key: str, data: bytes) -> str:
        """Store ``data`` only if ``key`` is absent (create-once); return its token.

        Raises ``RecordExists`` when another writer's object is already there; the
        stored bytes are then that writer's. A retry of our own write whose response was
        lost is recognised and reported as our success, never as ``RecordExists``.
        """
        ...

    def swap(self, key: str, data: bytes, expected_token: str) -> str:
        """Replace the object only if its token is still ``expected_token``
        (compare-and-swap); return the new token.

        Raises ``VersionConflict`` when someone else wrote since the token was read, and
        ``KeyNotFound`` when the key has been deleted.
        """
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Return every key that starts with ``prefix`` (string prefix, as S3), all pages,
        sorted. Objects whose names are not valid keys are skipped."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; deleting an absent key is not an error."""
        ...

    def close(self) -> None:
        """Release connections and worker threads (idempotent)."""
        ...


@runtime_checkable
class HashingGet(Protocol):
    """An optional capability of a store (checked with ``isinstance``): a read that also
    returns a digest (``gradientmail.digests``: the one the blob's reference names) of the bytes
    it returns, computed while they arrive, so verifying a blob costs no pass of its own after
    the download (the S3 store hashes each contiguous stretch while later parts stream). Stores
    without it are read with :meth:`Mailbox.get` and hashed afterwards; the caller compares the
    digest either way."""

    def get_hashed(self, key: str, digest: DigestName, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """:meth:`Mailbox.get` (same errors, same allowance), and the hex ``digest`` of exactly
        the bytes returned."""
        ...


@runtime_checkable
class HashingPut(Protocol):
    """An optional capability of a store (checked with ``isinstance``): a write that also
    returns a digest (the run's ``blob_digest``) of what it stored, taken in the store's one pass
    over the bytes, so a blob's digest (its reference's ``sha256`` or ``blake3``) costs no pass of
    its own. The S3 store hands a sha256 to the server as the object's ``x-amz-checksum-sha256``,
    which refuses a body that does not match (``BadDigest``), in place of botocore's own checksum
    and payload signing passes (S3 knows no BLAKE3: such a body is guarded by TCP or TLS on the way,
    as every multipart part is, and checked by every reader); it writes a :class:`Gathered`
    payload straight from its pieces. Stores without it are written with :meth:`Mailbox.put` (a
    gathered payload joined) and hashed apart."""

    def put_hashed(self, key: str, data: bytes | Gathered, digest: DigestName) -> tuple[str, str]:
        """:meth:`Mailbox.put` (same errors), and the hex ``digest`` of ``data``. A
        :class:`Gathered` payload is stored as the concatenation of its pieces."""
        ...


@runtime_checkable
class StampedGet(Protocol):
    """An optional capability of a store (checked with ``isinstance``): a versioned read that also
    says when the store wrote the bytes it returns (``ObjectInfo.modified_at``), from the same
    answer: S3's ``Last-Modified`` of the GET, a file's ``fstat`` while it is open. Lease observers
    judge a lease's age by it (``store.leases``) with no HEAD of their own; stores without it are
    judged on the observer's clock alone."""

    def get_stamped(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]:
        """:meth:`Mailbox.get_versioned` (same errors, same allowance), and the stored object's
        size, token and stamp, all of exactly the bytes returned."""
        ...


OPTIONAL_CAPABILITIES: tuple[str, ...] = ("get_hashed", "put_hashed", "get_stamped")
"""The operations some stores offer beyond :class:`Mailbox`, each with a protocol of its own that
callers probe with ``isinstance`` (``get_hashed``: :class:`HashingGet`; ``put_hashed``:
:class:`HashingPut`; ``get_stamped``: :class:`StampedGet`). :class:`ForwardingMailbox`
forwards every one its inner store has, so a wrapper never silently loses a capability; a store
that grows a new one adds it here (``tests/test_forwarding_mailbox.py`` checks every store)."""


class ForwardingMailbox:
    """A mailbox that passes every operation to ``inner``: subclass it and override the one or two
    operations to meter, delay or fail (the way transports wrap transports in httpx).

    The optional capabilities (:data:`OPTIONAL_CAPABILITIES`) are forwarded too, and are present
    exactly when ``inner`` has them (``isinstance(wrapper, HashingGet)`` answers as for ``inner``).
    They are set on the instance, because Python 3.12 checks protocols with ``getattr_static``,
    which sees instance attributes but not ``__getattr__``. A subclass that defines one itself keeps
    its own. A subclass that overrides ``get`` has hashed reads go through its ``get`` and hashed
    afterwards, so its metering or faults see every read; override ``get_hashed`` as well to keep
    hashing while the bytes arrive. The same holds for ``put`` and ``put_hashed``, and for
    ``get_versioned`` and ``get_stamped`` (read through the subclass's ``get_versioned``, such a
    read carries no stamp).
    """

    def __init__(self, inner: Mailbox) -> None:
        self.inner = inner
        forwarders = {
            "get_hashed": self._forward_get_hashed,
            "put_hashed": self._forward_put_hashed,
            "get_stamped": self._forward_get_stamped,
        }
        for name in OPTIONAL_CAPABILITIES:
            if hasattr(inner, name) and not hasattr(type(self), name):
                setattr(self, name, forwarders[name])

    def _forward_get_hashed(self, key: str, digest: DigestName, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        inner = self.inner
        if type(self).get is not ForwardingMailbox.get or not isinstance(inner, HashingGet):
            data = self.get(key, max_bytes=max_bytes)
            return data, hex_digest(digest, data)
        return inner.get_hashed(key, digest, max_bytes=max_bytes)

    def _forward_get_stamped(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]:
        inner = self.inner
        if type(self).get_versioned is not ForwardingMailbox.get_versioned or not isinstance(inner, StampedGet):
            data, token = self.get_versioned(key, max_bytes=max_bytes)
            return data, ObjectInfo(size=len(data), token=token)
        return inner.get_stamped(key, max_bytes=max_bytes)

    def _forward_put_hashed(self, key: str, data: bytes | Gathered, digest: DigestName) -> tuple[str, str]:
        inner = self.inner
        if type(self).put is not ForwardingMailbox.put or not isinstance(inner, HashingPut):
            whole = joined(data)
            return self.put(key, whole), hex_digest(digest, whole)
        return inner.put_hashed(key, data, digest)

    @property
    def url(self) -> str:
        return self.inner.url

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        return self.inner.get(key, max_bytes=max_bytes)

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        return self.inner.get_versioned(key, max_bytes=max_bytes)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(key, data)

    def create(self, key: str, data: bytes) -> str:
        return self.inner.create(key, data)

    def swap(self, key: str, data: bytes, expected_token: str) -> str:
        return self.inner.swap(key, data, expected_token)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def close(self) -> None:
        self.inner.close()
