"""A mailbox in a directory: the embedded default, no server needed.

Layout: the object for key ``a/b/c`` is the file ``<root>/a/b/c``. Everything else this
store keeps has a ``~`` in its name, a character keys may not contain, so it can never be
mistaken for a key: temporary files ``<name>.~tmp.<random>`` beside their target and the
lock stripes in ``<root>/~locks/``.

Several processes (on one machine, or on a shared POSIX filesystem with ``flock`` and
hard links) may use one directory at once:

* ``put`` writes a temporary file, fsyncs it and ``os.replace``-s it over the key, so a
  reader sees the old bytes or the new ones, never a partial file.
* ``create`` writes a temporary file and hard-links it to the key: ``link`` fails with
  EEXIST if the key exists, which is atomic create-once, and the key never shows a
  partial file (unlike ``O_EXCL`` followed by writing).
* ``swap``, ``put`` and ``delete`` replace the key while holding its lock stripe
  (``flock``), so a compare-and-swap cannot interleave with another write.
* Tokens are BLAKE3 hashes of the content (``_content.TOKEN_DIGEST``), so a token is never
  reused by an unrelated write (an inode number or a timestamp could be). Because the token *is*
  the content's BLAKE3, this store offers ``put_hashed`` and ``get_hashed``
  (``HashingPut``/``HashingGet``) at no cost for a run whose blobs are pinned by BLAKE3: a blob's
  digest is the token, and each byte is hashed once, in the same cache-sized chunk that is
  written (a :class:`~gradientmail.mailbox.base.Gathered` payload straight from its pieces,
  never joined). A sha256 run's blob is hashed by both in that chunk loop.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from gradientmail.digests import DigestName, check_digest_name, hex_digest, new_hasher
from gradientmail.errors import (
    InvalidKey,
    KeyNotFound,
    MailboxError,
    MailboxMisconfigured,
    MailboxUnavailable,
    RecordExists,
    VersionConflict,
)
from gradientmail.mailbox._content import (
    TOKEN_DIGEST,
    as_max_bytes,
    as_payload,
    as_token,
    content_token,
    read_at_most,
    stream_token,
    too_large,
)
from gradientmail.mailbox.base import Gathered, ObjectInfo
from gradientmail.mailbox.keys import is_valid_key, validate_key, validate_prefix

__all__ = ["FileMailbox"]

WRITE_CHUNK_BYTES = 1024 * 1024
"""How much of a payload is hashed and then written at a time: small enough that the write finds
the bytes the hash just read still in cache, large enough that a call costs nothing against it."""

_LOCK_DIR = "~locks"
_LOCK_STRIPES = 256
_TEMP_MARK = ".~tmp."
_RESERVED_CHAR = "~"
_MISSING = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR)
MTIME_RESOLUTION_S = 0.01
"""How coarse a file's mtime may be: Linux stamps writes from its coarse clock, truncated to the
timer tick (at most 10 ms at HZ = 100); other systems are finer."""
_USER_FIXABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTSUP, errno.EXDEV)


class FileMailbox:
    """Mailbox stored in the directory ``path`` (created if missing).

    Args:
        path: the mailbox root; every key is a file below it.
        fsync: flush files and directories to disk on every write, so a committed record
            survives a power loss. Turn off only for throwaway runs.

    Raises:
        MailboxMisconfigured: the directory cannot be created or written.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self._root = Path(path).expanduser().absolute()
        self._fsync = fsync
        self._lock_dir = self._root / _LOCK_DIR
        try:
            self._lock_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MailboxMisconfigured(f"cannot create the mailbox directory {str(self._root)!r}: {exc.strerror}") from exc

    @property
    def url(self) -> str:
        return "file://" + quote(str(self._root))

    @property
    def path(self) -> Path:
        """The mailbox root directory."""
        return self._root

    # -- reads -------------------------------------------------------------------------

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        return self.get_versioned(key, max_bytes=max_bytes)[0]

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        data, info = self.get_stamped(key, max_bytes=max_bytes)
        return data, info.token

    def get_stamped(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]:
        """:meth:`get_versioned`, and the file's mtime from the open file (``StampedGet``): a
        replacement after the open is a new file, so the stamp is of the bytes read."""
        path = self._path(key)
        allowance = as_max_bytes(max_bytes)
        try:
            # Size from the open file, not the path: a replacement between a stat and the
            # open cannot slip a bigger version past the check.
            with open(path, "rb", buffering=0) as stream:
                status = os.fstat(stream.fileno())
                if allowance is None:
                    data = stream.read()
                else:
                    size = status.st_size
                    if size > allowance:
                        raise too_large(key, self.url, size, allowance)
                    # Bounded even so: the file may grow after the fstat (someone writing
                    # into it in place), or not be a regular file at all.
                    data = read_at_most(stream, allowance + 1)
                    if len(data) > allowance:
                        raise too_large(key, self.url, None, allowance)
        except OSError as exc:
            raise self._error(exc, "get", key) from exc
        stamp = status.st_mtime_ns / 1e9
        return data, ObjectInfo(len(data), content_token(data), modified_at=stamp, modified_resolution_s=MTIME_RESOLUTION_S)

    def get_hashed(self, key: str, digest: DigestName, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """:meth:`get`, and the hex ``digest`` of the bytes returned (``HashingGet``): the token,
        taken once, when it is the token's digest; else that digest alone (no token taken)."""
        if check_digest_name(digest) == TOKEN_DIGEST:
            return self.get_versioned(key, max_bytes=max_bytes)
        data = self.get(key, max_bytes=max_bytes)
        return data, hex_digest(digest, data)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            # Hash through the open file, so size and token describe one version even if
            # the key is replaced meanwhile.
            with open(path, "rb") as stream:
                size, token = stream_token(stream)
                modified_ns = os.fstat(stream.fileno()).st_mtime_ns
        except OSError as exc:
            if exc.errno in _MISSING:
                return None
            raise self._error(exc, "head", key) from exc
        return ObjectInfo(size=size, token=token, modified_at=modified_ns / 1e9, modified_resolution_s=MTIME_RESOLUTION_S)

    def exists(self, key: str) -> bool:
        path = self._path(key)
        try:
            return stat.S_ISREG(os.stat(path).st_mode)
        except OSError as exc:
            if exc.errno in _MISSING:
                return False
            raise self._error(exc, "exists", key) from exc

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        directory, _, partial = prefix.rpartition("/")
        start = os.path.join(self._root, *directory.split("/")) if directory else str(self._root)
        keys: list[str] = []
        try:
            self._walk(start, directory + "/" if directory else "", partial, keys)
        except OSError as exc:
            raise self._error(exc, "list", prefix or "<root>") from exc
        return sorted(keys)

    # -- writes ------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> str:
        return self._put(key, as_payload(data))[0]

    def put_hashed(self, key: str, data: bytes | Gathered, digest: DigestName) -> tuple[str, str]:
        """:meth:`put`, and the hex ``digest`` of ``data`` (``HashingPut``): the token when it is
        the token's digest, else hashed beside it; either way in the one pass that writes it. A
        :class:`Gathered` payload is written out of its pieces."""
        also = None if check_digest_name(digest) == TOKEN_DIGEST else digest
        token, other = self._put(key, data if isinstance(data, Gathered) else as_payload(data), also)
        return token, other or token

    def _put(self, key: str, payload: bytes | Gathered, also: DigestName | None = None) -> tuple[str, str]:
        """Write ``payload`` at ``key``; its token and (``also``) its hex digest of that kind."""
        path = self._path(key)
        temp, token, other = self._write_temp(path, payload, key, also)
        try:
            with self._locked(key):
                os.replace(temp, path)
        except OSError as exc:
            _unlink_quietly(temp)
            raise self._error(exc, "put", key) from exc
        self._sync_dir(path.parent, key)
        return token, other

    def create(self, key: str, data: bytes) -> str:
        path = self._path(key)
        temp, token, _ = self._write_temp(path, as_payload(data), key)
        try:
            os.link(temp, path)
        except FileExistsError as exc:
            if path.is_dir():
                raise self._conflict(key) from exc
            raise RecordExists(f"mailbox key {key!r} already exists in {self.url}") from exc
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EMLINK):
                raise MailboxMisconfigured(
                    f"create {key!r} in {self.url} refused: create-once needs a filesystem with hard links ({exc.strerror})"
                ) from exc
            raise self._error(exc, "create", key) from exc
        finally:
            _unlink_quietly(temp)  # the key keeps its own link to the data
        self._sync_dir(path.parent, key)
        return token

    def swap(self, key: str, data: bytes, expected_token: str) -> str:
        path = self._path(key)
        as_token(expected_token)
        temp, token, _ = self._write_temp(path, as_payload(data), key)
        try:
            with self._locked(key):
                with open(path, "rb") as stream:
                    _, current_token = stream_token(stream)
                if current_token != expected_token:
                    raise VersionConflict(f"mailbox key {key!r} changed since its token was read")
                os.replace(temp, path)
        except BaseException as exc:
            _unlink_quietly(temp)
            if isinstance(exc, OSError):
                raise self._error(exc, "swap", key) from exc
            raise
        self._sync_dir(path.parent, key)
        return token

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            with self._locked(key):
                os.unlink(path)
        except OSError as exc:
            if exc.errno in _MISSING:
                return
            raise self._error(exc, "delete", key) from exc
        self._sync_dir(path.parent, key)

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own files."""

    # -- helpers -----------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        validate_key(key)
        return self._root.joinpath(*key.split("/"))

    def _write_temp(
        self, path: Path, payload: bytes | Gathered, key: str, also: DigestName | None = None
    ) -> tuple[str, str, str]:
        """Write ``payload`` to a fresh temporary file beside ``path``; return its name, the
        payload's token and (``also``) its hex digest of that kind, else "": both hashed chunk by
        chunk just before each chunk is written."""
        temp = f"{path}{_TEMP_MARK}{uuid.uuid4().hex}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise self._error(exc, "write", key) from exc
        try:
            try:
                token, other = _write_hashed(fd, payload, also)
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            _unlink_quietly(temp)
            raise self._error(exc, "write", key) from exc
        return temp, token, other

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """Hold the ``flock`` stripe of ``key`` (one of a fixed set of lock files, so lock
        files never pile up). ``flock`` conflicts between separate opens, so it excludes
        other threads of this process as well as other processes."""
        stripe = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % _LOCK_STRIPES
        lock_path = self._lock_dir / f"{stripe:03d}.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _sync_dir(self, directory: Path, key: str) -> None:
        """Make a rename, link or unlink in ``directory`` durable."""
        if not self._fsync:
            return
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._error(exc, "sync", key) from exc

    def _walk(self, directory: str, key_prefix: str, partial: str, keys: builtins.list[str]) -> None:
        """Collect keys below ``directory`` whose first name starts with ``partial``."""
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            if exc.errno in _MISSING:
                return
            raise
        for entry in entries:
            name = entry.name
            if _RESERVED_CHAR in name or not name.startswith(partial) or not is_valid_key(name):
                continue
            if entry.is_dir(follow_symlinks=False):
                self._walk(entry.path, key_prefix + name + "/", "", keys)
            elif entry.is_file(follow_symlinks=False):
                keys.append(key_prefix + name)

    def _conflict(self, key: str) -> InvalidKey:
        return InvalidKey(
            f"invalid mailbox key {key!r}: it clashes with another key's directory in "
            f"{self.url} (a directory store cannot hold both 'a' and 'a/b')"
        )

    def _error(self, exc: OSError, operation: str, key: str) -> MailboxError:
        """Translate an ``OSError`` into the error a caller can act on."""
        if not self._root.is_dir():
            return MailboxMisconfigured(f"the mailbox directory {str(self._root)!r} is gone or not a directory")
        if exc.errno in _MISSING and operation in ("get", "swap"):
            if exc.errno == errno.EISDIR:
                return KeyNotFound(f"mailbox key {key!r} not found in {self.url} (it is a directory)")
            return KeyNotFound(f"mailbox key {key!r} not found in {self.url}")
        if exc.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
            return self._conflict(key)
        reason = exc.strerror or str(exc)
        if exc.errno in _USER_FIXABLE:
            return MailboxMisconfigured(f"{operation} {key!r} in {self.url} refused: {reason}")
        return MailboxUnavailable(f"{operation} {key!r} in {self.url} failed: {reason}")


def _write_hashed(fd: int, payload: bytes | Gathered, also: DigestName | None = None) -> tuple[str, str]:
    """Write ``payload`` to ``fd`` in chunks of :data:`WRITE_CHUNK_BYTES`, each hashed just before
    it is written (still in cache); return the payload's token (its :data:`TOKEN_DIGEST`) and,
    with ``also``, its hex digest of that kind too, else ""."""
    hasher = new_hasher(TOKEN_DIGEST)
    other = new_hasher(also) if also is not None else None
    for piece in payload.pieces if isinstance(payload, Gathered) else (memoryview(payload),):
        for start in range(0, len(piece), WRITE_CHUNK_BYTES):
            chunk = piece[start : start + WRITE_CHUNK_BYTES]
            hasher.update(chunk)
            if other is not None:
                other.update(chunk)
            while chunk:  # a write to a file may be short
                chunk = chunk[os.write(fd, chunk) :]
    return hasher.hexdigest(), other.hexdigest() if other is not None else ""


def _unlink_quietly(path: str) -> None:
    """Remove a temporary file that may already be gone (renamed or never written)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
