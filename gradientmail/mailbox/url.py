"""Open a mailbox from its URL, the form a mailbox location takes in configuration,
command lines and child processes.

=====================================================  =====================================
``s3://bucket/prefix?endpoint=…&region=…&profile=…``   :class:`S3Mailbox` (also
                                                        ``addressing=path`` and every
                                                        :class:`S3Tuning` field)
``minio://host:port/bucket/prefix``                    :class:`MinioMailbox` (``secure=false``
                                                        for http, ``region=``, tuning fields)
``file:///absolute/path``                               :class:`FileMailbox` (``fsync=false``)
``memory://name``                                       the process-wide
                                                        :class:`MemoryMailbox` called
                                                        ``name``; ``memory://`` a fresh one
=====================================================  =====================================

Credentials are never part of a URL (URLs end up in logs, manifests, process lists): a URL with
``user:password@`` is refused. S3 and MinIO take them from the environment
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_SHARED_CREDENTIALS_FILE``, a profile,
the machine's role; for MinIO also ``MINIO_ACCESS_KEY``/``MINIO_SECRET_KEY``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from gradientmail.errors import InvalidConfig
from gradientmail.mailbox.base import Mailbox
from gradientmail.mailbox.directory import FileMailbox
from gradientmail.mailbox.memory import MemoryMailbox
from gradientmail.mailbox.minio import MinioMailbox
from gradientmail.mailbox.s3 import S3Mailbox, S3Tuning

__all__ = ["open_mailbox"]

_FIELD = "mailbox url"
_NO_CREDENTIALS = (
    "takes no credentials in the URL; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
    "(or AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE{minio}) in the environment"
)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def open_mailbox(url: str) -> Mailbox:
    """Return the mailbox ``url`` names; ``open_mailbox(m.url)`` is equivalent to ``m``.

    Raises:
        InvalidConfig: unknown scheme or parameter, or a malformed URL (field
            ``"mailbox url"``; credentials are never echoed).
    """
    if not isinstance(url, str):
        raise InvalidConfig(_FIELD, f"must be a str, not {type(url).__name__}")
    parts = urlsplit(url)
    opener = _OPENERS.get(parts.scheme.lower())
    if opener is None:
        known = ", ".join(f"{scheme}://" for scheme in _OPENERS)
        raise InvalidConfig(_FIELD, f"{_redacted(parts)!r} has no known scheme (use one of {known})")
    if parts.fragment:
        raise InvalidConfig(_FIELD, f"{_redacted(parts)!r} must not have a '#fragment'")
    return opener(parts)


def _open_s3(parts: SplitResult) -> Mailbox:
    if "@" in parts.netloc:
        raise InvalidConfig(_FIELD, "an s3:// URL " + _NO_CREDENTIALS.format(minio=""))
    if not parts.netloc:
        raise InvalidConfig(_FIELD, f"{parts.geturl()!r} names no bucket (s3://bucket/prefix)")
    params = _params(parts)
    connection = {
        "endpoint_url": params.pop("endpoint", None),
        "region": params.pop("region", None),
        "profile": params.pop("profile", None),
        "addressing_style": params.pop("addressing", None),
    }
    tuning = _tuning(params, parts)
    return S3Mailbox(parts.netloc, unquote(parts.path).strip("/"), tuning=tuning, **connection)  # type: ignore[arg-type]


def _open_minio(parts: SplitResult) -> Mailbox:
    if "@" in parts.netloc:
        raise InvalidConfig(_FIELD, "a minio:// URL " + _NO_CREDENTIALS.format(minio=", or MINIO_ACCESS_KEY/MINIO_SECRET_KEY"))
    if not parts.hostname:
        raise InvalidConfig(_FIELD, f"{_redacted(parts)!r} names no host (minio://host:port/bucket/prefix)")
    bucket, _, prefix = unquote(parts.path).lstrip("/").partition("/")
    if not bucket:
        raise InvalidConfig(_FIELD, f"{_redacted(parts)!r} names no bucket (minio://host:port/bucket/prefix)")
    params = _params(parts)
    secure = _boolean(params.pop("secure", "true"), "secure")
    region = params.pop("region", "us-east-1")
    tuning = _tuning(params, parts)
    return MinioMailbox(parts.netloc, None, None, bucket, prefix.strip("/"), secure=secure, region=region, tuning=tuning)


def _open_file(parts: SplitResult) -> Mailbox:
    if parts.netloc not in ("", "localhost"):
        raise InvalidConfig(_FIELD, f"{parts.geturl()!r}: file URLs name a local path (file:///absolute/path)")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise InvalidConfig(_FIELD, f"{parts.geturl()!r}: the path must be absolute (file:///absolute/path)")
    params = _params(parts)
    fsync = _boolean(params.pop("fsync", "true"), "fsync")
    _no_more(params, parts)
    return FileMailbox(path, fsync=fsync)


def _open_memory(parts: SplitResult) -> Mailbox:
    if parts.path not in ("", "/") or parts.query:
        raise InvalidConfig(_FIELD, f"{parts.geturl()!r}: a memory URL is memory://name")
    return MemoryMailbox.named(parts.netloc) if parts.netloc else MemoryMailbox()


_OPENERS: dict[str, Callable[[SplitResult], Mailbox]] = {
    "s3": _open_s3,
    "minio": _open_minio,
    "file": _open_file,
    "memory": _open_memory,
}


def _params(parts: SplitResult) -> dict[str, str]:
    params: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in params:
            raise InvalidConfig(_FIELD, f"parameter {name!r} is given twice")
        params[name] = value
    return params


def _tuning(params: dict[str, str], parts: SplitResult) -> S3Tuning:
    """Build :class:`S3Tuning` from the remaining query parameters."""
    values: dict[str, object] = {}
    for field in dataclasses.fields(S3Tuning):
        if field.name not in params:
            continue
        text = params.pop(field.name)
        if isinstance(field.default, bool):
            values[field.name] = _boolean(text, field.name)
            continue
        kind: Callable[[str], object] = int if isinstance(field.default, int) else float
        try:
            values[field.name] = kind(text)
        except ValueError as exc:
            raise InvalidConfig(field.name, f"{text!r} is not a valid {kind.__name__}") from exc
    _no_more(params, parts)
    return S3Tuning(**values)  # type: ignore[arg-type]


def _boolean(text: str, name: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise InvalidConfig(name, f"{text!r} is not true or false")


def _no_more(params: dict[str, str], parts: SplitResult) -> None:
    if params:
        names = ", ".join(sorted(params))
        raise InvalidConfig(_FIELD, f"unknown parameter(s) {names} in a {parts.scheme}:// URL")


def _redacted(parts: SplitResult) -> str:
    """The URL with any password replaced, for error messages."""
    if parts.password is None:
        return parts.geturl()
    netloc = f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}"
    return parts._replace(netloc=netloc).geturl()
