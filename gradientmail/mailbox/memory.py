"""A mailbox in this process's memory: for tests and single-process runs.

Tokens are content hashes, as in the directory store, so code tested here meets the same
token behaviour as on S3 (identical bytes, identical token).
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Callable

from gradientmail.errors import InvalidConfig, KeyNotFound, RecordExists, VersionConflict
from gradientmail.mailbox._content import as_max_bytes, as_payload, as_token, content_token, too_large
from gradientmail.mailbox.base import ObjectInfo
from gradientmail.mailbox.keys import is_valid_key, validate_key, validate_prefix

__all__ = ["MemoryMailbox"]

_registry_lock = threading.Lock()
_named: dict[str, MemoryMailbox] = {}
"""Mailboxes opened by name (``memory://name``) live as long as the process."""
_anonymous: weakref.WeakValueDictionary[str, MemoryMailbox] = weakref.WeakValueDictionary()
"""Unnamed mailboxes are reachable by their URL only while someone holds them."""


class MemoryMailbox:
    """Thread-safe in-memory mailbox.

    ``MemoryMailbox()`` is private to its holder; :meth:`named` (and
    ``open_mailbox("memory://name")``) returns one process-wide mailbox per name, so two
    opens of the same URL share state. Nothing survives the process. ``clock`` stamps the writes
    (``ObjectInfo.modified_at``): this process is the store's clock; a test on a fake clock
    passes its own.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._objects: dict[str, tuple[bytes, str]] = {}
        self._clock = clock
        self._written_at: dict[str, float] = {}
        """When each object was last written, on ``clock``."""
        self._lock = threading.Lock()
        with _registry_lock:
            self._name = f"anonymous-{uuid.uuid4().hex[:16]}"
            _anonymous[self._name] = self

    @classmethod
    def named(cls, name: str) -> MemoryMailbox:
        """The process-wide mailbox called ``name``, created on first use.

        Raises:
            InvalidConfig: ``name`` is not a single key segment.
        """
        if "/" in name or not is_valid_key(name):
            raise InvalidConfig("memory name", f"{name!r} must be letters, digits and '._-='")
        with _registry_lock:
            existing = _named.get(name) or _anonymous.get(name)
            if existing is not None:
                return existing
        mailbox = cls()
        with _registry_lock:
            # Another thread may have won while we built ours; keep the first.
            existing = _named.get(name)
            if existing is not None:
                return existing
            del _anonymous[mailbox._name]
            mailbox._name = name
            _named[name] = mailbox
        return mailbox

    @property
    def url(self) -> str:
        return f"memory://{self._name}"

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        return self.get_versioned(key, max_bytes=max_bytes)[0]

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        data, info = self.get_stamped(key, max_bytes=max_bytes)
        return data, info.token

    def get_stamped(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]:
        """:meth:`get_versioned`, and when the bytes were written (``StampedGet``)."""
        validate_key(key)
        allowance = as_max_bytes(max_bytes)
        with self._lock:
            found = self._objects.get(key)
            written_at = self._written_at.get(key)
        if found is None:
            raise KeyNotFound(f"mailbox key {key!r} not found in {self.url}")
        if allowance is not None and len(found[0]) > allowance:
            raise too_large(key, self.url, len(found[0]), allowance)
        return found[0], ObjectInfo(size=len(found[0]), token=found[1], modified_at=written_at)

    def head(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        with self._lock:
            found = self._objects.get(key)
            written_at = self._written_at.get(key)
        return None if found is None else ObjectInfo(size=len(found[0]), token=found[1], modified_at=written_at)

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def put(self, key: str, data: bytes) -> str:
        validate_key(key)
        payload = as_payload(data)
        token = content_token(payload)
        with self._lock:
            self._objects[key] = (payload, token)
            self._written_at[key] = self._clock()
        return token

    def create(self, key: str, data: bytes) -> str:
        validate_key(key)
        payload = as_payload(data)
        token = content_token(payload)
        with self._lock:
            if key in self._objects:
                raise RecordExists(f"mailbox key {key!r} already exists in {self.url}")
            self._objects[key] = (payload, token)
            self._written_at[key] = self._clock()
        return token

    def swap(self, key: str, data: bytes, expected_token: str) -> str:
        validate_key(key)
        as_token(expected_token)
        payload = as_payload(data)
        token = content_token(payload)
        with self._lock:
            found = self._objects.get(key)
            if found is None:
                raise KeyNotFound(f"mailbox key {key!r} not found in {self.url}")
            if found[1] != expected_token:
                raise VersionConflict(f"mailbox key {key!r} changed since its token was read")
            self._objects[key] = (payload, token)
            self._written_at[key] = self._clock()
        return token

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        with self._lock:
            keys = [key for key in self._objects if key.startswith(prefix)]
        return sorted(keys)

    def delete(self, key: str) -> None:
        validate_key(key)
        with self._lock:
            self._objects.pop(key, None)
            self._written_at.pop(key, None)

    def close(self) -> None:
        """Nothing to release; the contents stay for other holders of the same name."""
