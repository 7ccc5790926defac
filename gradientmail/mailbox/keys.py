"""The one place that decides what a mailbox key is.

Every store calls :func:`validate_key` before touching its backend, so a key that could
escape the run's prefix (``..``, an absolute path, a backslash) is refused the same way
everywhere and never reaches a filesystem or an S3 request.
"""

from __future__ import annotations

import re

from gradientmail.errors import InvalidKey

__all__ = ["MAX_KEY_LENGTH", "MAX_SEGMENT_LENGTH", "validate_key", "validate_prefix", "is_valid_key"]

MAX_KEY_LENGTH = 512
"""Characters in a whole key; leaves room under S3's 1,024-byte limit for a run prefix."""

MAX_SEGMENT_LENGTH = 200
"""Characters in one segment; leaves room under the 255-byte file-name limit for the
directory store's temporary-file suffix."""

_SEGMENT = re.compile(r"[A-Za-z0-9._=-]+")


def _problem(key: object) -> str | None:
    """Say what is wrong with ``key``, or None when it is a valid key."""
    if not isinstance(key, str):
        return f"must be a str, not {type(key).__name__}"
    if not key:
        return "is empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"is {len(key)} characters long, more than {MAX_KEY_LENGTH}"
    if "\\" in key:
        return "contains a backslash"
    if key.startswith("/"):
        return "starts with '/' (keys are relative to the mailbox root)"
    if key.endswith("/"):
        return "ends with '/'"
    for segment in key.split("/"):
        if not segment:
            return "has an empty segment ('//')"
        if segment in (".", ".."):
            return f"has a {segment!r} segment"
        if len(segment) > MAX_SEGMENT_LENGTH:
            return f"has a segment longer than {MAX_SEGMENT_LENGTH} characters"
        if not _SEGMENT.fullmatch(segment):
            bad = sorted({ch for ch in segment if not _SEGMENT.fullmatch(ch)})
            return f"has characters outside letters, digits and '._-=': {''.join(bad)!r}"
    return None


def validate_key(key: str) -> str:
    """Return ``key`` unchanged if it is a valid mailbox key.

    A key is 1 to ``MAX_KEY_LENGTH`` characters of ``/``-separated segments; each segment
    is letters, digits and ``._-=``, at most ``MAX_SEGMENT_LENGTH`` long, and neither
    ``.`` nor ``..``. No leading or trailing ``/``, no empty segment, no backslash.

    Raises:
        InvalidKey: naming the key and the first problem found.
    """
    problem = _problem(key)
    if problem is not None:
        raise InvalidKey(f"invalid mailbox key {key!r}: {problem}")
    return key


def is_valid_key(key: object) -> bool:
    """True when ``key`` passes :func:`validate_key`; used to skip foreign objects in listings."""
    return _problem(key) is None


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can start a key: empty, or a valid key with at most one trailing ``/``.

    A prefix matches keys by string prefix, as S3 does (``"a/b"`` matches ``"a/bc/d"``).

    Raises:
        InvalidKey: naming the prefix and its problem.
    """
    if prefix == "":
        return prefix
    if not isinstance(prefix, str):
        raise InvalidKey(f"invalid mailbox prefix {prefix!r}: must be a str, not {type(prefix).__name__}")
    body = prefix[:-1] if prefix.endswith("/") else prefix
    problem = _problem(body)
    if problem is not None:
        raise InvalidKey(f"invalid mailbox prefix {prefix!r}: {problem}")
    return prefix
