"""The S3 mailbox: any S3-compatible bucket (AWS S3, MinIO, SeaweedFS, R2, …), on boto3.

Create-once is ``PutObject``/``CompleteMultipartUpload`` with ``If-None-Match: *``;
compare-and-swap is the same with ``If-Match: <etag>``. Every write stores a fresh writer
nonce in the object's user metadata (``x-amz-meta-gm-writer``): when a conditional write
is answered 412 (or its multipart upload has vanished), the object is read back and, if
it carries our nonce, the earlier attempt landed and only its response was lost, so the
call succeeds instead of reporting a race it did not lose.

boto3 is imported on first use, so the package works without the ``s3`` extra.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, urlencode

from gradientmail.digests import DigestName, Hasher, check_digest_name, new_hasher
from gradientmail.errors import (
    InvalidConfig,
    KeyNotFound,
    MailboxError,
    MailboxMisconfigured,
    MailboxUnavailable,
    RecordExists,
    VersionConflict,
    install_hint,
)
from gradientmail.mailbox import _s3_transfer
from gradientmail.mailbox._content import as_max_bytes, as_payload, as_token, too_large
from gradientmail.mailbox._s3_errors import error_code, http_status, is_transport_error, translate
from gradientmail.mailbox.base import Gathered, ObjectInfo
from gradientmail.mailbox.keys import is_valid_key, validate_key, validate_prefix

if TYPE_CHECKING:
    import boto3

__all__ = ["S3Mailbox", "S3Tuning"]

_MiB = 1024 * 1024
NONCE_METADATA = "gm-writer"
"""User-metadata field holding the writer nonce of every object this store writes."""
_PROBE_PREFIX = "~gm-probe/"
"""Scratch keys of the conditional-write check; ``~`` keeps them out of the key space."""
AddressingStyle = Literal["auto", "path", "virtual"]


@dataclass(frozen=True)
class S3Tuning:
    """Knobs of the S3 mailbox. The defaults suit fragments of tens to hundreds of MB on a
    LAN or in-region link; each field says how to size it."""

    max_attempts: int = 5
    """Tries per request, first included (botocore's "standard" retry mode: 5xx,
    throttling, connection resets and timeouts, with jittered exponential backoff).
    Raise it for flaky links; 1 disables retries."""
    connect_timeout_s: float = 5.0
    """Seconds to open a connection. Small: an unreachable store should fail fast."""
    read_timeout_s: float = 60.0
    """Seconds without a byte before a request is abandoned (and retried)."""
    multipart_threshold_bytes: int = 16 * _MiB
    """Payloads larger than this go as parallel multipart uploads; smaller ones in one
    request. Low enough that a payload of a few parts already gets several connections:
    on a long link one connection carries only about its window per round trip."""
    part_size_bytes: int = 8 * _MiB
    """Size of one uploaded part and of one downloaded range (at least 5 MiB, S3's
    minimum; boto3's managed transfer uses 8 MiB too). Aim for a few parts per
    concurrent connection: measured (benchmarks/mailbox_throughput.py), 8 MiB parts read
    a 64 MiB payload 1.4x faster than 16 MiB ones over a 20 ms link, where 16 MiB parts
    keep only 4 connections busy, and were no slower on loopback."""
    max_concurrency: int = 8
    """Parts or ranges in flight at once per mailbox; about bandwidth / per-connection
    throughput. Sized by the link, not the cores: a thread waiting on a socket costs no CPU,
    and on the 2-core VM fewer did not make the syncer's round faster (2 or 4 in flight: the
    round 1.03 / 0.97x, its collect 1.22 / 1.08x the same round with 8; docs/benchmarks.md)."""
    verify_conditional_writes: bool = True
    """Before the first create-once or swap, check on a scratch key that the store
    refuses a write whose condition fails (some S3-compatible stores silently ignore
    If-None-Match, which would break one-commit-per-version)."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InvalidConfig("max_attempts", f"must be an int >= 1, got {self.max_attempts!r}")
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise InvalidConfig(name, f"must be a positive number of seconds, got {value!r}")
        if not isinstance(self.part_size_bytes, int) or self.part_size_bytes < _s3_transfer.MIN_PART_BYTES:
            raise InvalidConfig("part_size_bytes", f"must be an int >= 5 MiB (S3's minimum part), got {self.part_size_bytes!r}")
        if not isinstance(self.multipart_threshold_bytes, int) or self.multipart_threshold_bytes < _s3_transfer.MIN_PART_BYTES:
            raise InvalidConfig("multipart_threshold_bytes", f"must be an int >= 5 MiB, got {self.multipart_threshold_bytes!r}")
        if not isinstance(self.max_concurrency, int) or self.max_concurrency < 1:
            raise InvalidConfig("max_concurrency", f"must be an int >= 1, got {self.max_concurrency!r}")


_loader_lock = threading.Lock()
_shared_loader: Any = None


def _botocore_session() -> Any:
    """A fresh botocore session that shares one loader of service models with the
    others: parsing the S3 model takes most of the ~100 ms a new client costs."""
    global _shared_loader
    import botocore.session

    session = botocore.session.get_session()
    with _loader_lock:
        if _shared_loader is None:
            _shared_loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _shared_loader)
    return session


class _PreconditionFailed(Exception):
    """A conditional write was refused and the object there is not ours."""


class S3Mailbox:
    """Mailbox in an S3 bucket under ``prefix`` (the run's root: key ``k`` is stored as
    ``prefix/k``).

    Credentials, region and endpoint come from boto3's usual chain (environment,
    ``AWS_PROFILE``, ``~/.aws``, ``AWS_ENDPOINT_URL``, instance roles) unless given here.
    Nothing is contacted until the first call.

    Args:
        bucket: an existing bucket.
        prefix: ``/``-separated path inside the bucket; empty for the bucket root.
        endpoint_url: e.g. ``http://minio:9000`` for a non-AWS store.
        region: signing region; stores other than AWS usually accept ``us-east-1``.
        profile: a profile of ``~/.aws/config``.
        access_key_id, secret_access_key, session_token: explicit credentials.
        addressing_style: ``"path"`` for most self-hosted stores, ``"virtual"`` or
            ``"auto"`` (botocore's default) for AWS.
        session: a ready ``boto3.Session`` (custom credential providers, event hooks);
            excludes ``profile`` and explicit keys.
        tuning: retries, timeouts and transfer sizes, see :class:`S3Tuning` (its defaults
            when None).

    Raises:
        InvalidConfig: an argument is malformed or arguments contradict each other.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        addressing_style: AddressingStyle | None = None,
        session: boto3.Session | None = None,
        tuning: S3Tuning | None = None,
    ) -> None:
        if not isinstance(bucket, str) or not bucket or "/" in bucket or bucket != bucket.strip():
            raise InvalidConfig("bucket", f"{bucket!r} is not a bucket name")
        root = prefix.strip("/") if isinstance(prefix, str) else prefix
        if root:
            try:
                validate_key(root)
            except MailboxError as exc:
                raise InvalidConfig("prefix", str(exc)) from exc
        if (access_key_id is None) != (secret_access_key is None):
            raise InvalidConfig("access_key_id", "give both access_key_id and secret_access_key, or neither")
        if session is not None and (profile or access_key_id or session_token):
            raise InvalidConfig("session", "a boto3 session excludes profile and explicit keys")
        if addressing_style not in (None, "auto", "path", "virtual"):
            raise InvalidConfig("addressing_style", f"must be 'auto', 'path' or 'virtual', got {addressing_style!r}")
        if endpoint_url is not None and not endpoint_url.startswith(("http://", "https://")):
            raise InvalidConfig("endpoint_url", f"must start with http:// or https://, got {endpoint_url!r}")
        self._bucket = bucket
        self._prefix = root
        self._root = f"{root}/" if root else ""
        self._endpoint_url = endpoint_url
        self._region = region
        self._profile = profile
        self._credentials = (access_key_id, secret_access_key, session_token)
        self._addressing_style = addressing_style
        self._session = session
        self._tuning = tuning or S3Tuning()
        self._lock = threading.Lock()
        self._client_obj: Any = None
        self._executor_obj: ThreadPoolExecutor | None = None
        self._bucket_checked = False
        self._conditions_checked = False

    # -- identity ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        params = {
            "endpoint": self._endpoint_url,
            "region": self._region,
            "profile": self._profile,
            "addressing": self._addressing_style,
        }
        query = urlencode({name: value for name, value in params.items() if value})
        return f"s3://{self._bucket}/{quote(self._prefix)}" + (f"?{query}" if query else "")

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to (resolved from the configuration once connected)."""
        if self._client_obj is not None:
            return str(self._client_obj.meta.endpoint_url)
        return self._endpoint_url or "the configured AWS endpoint"

    # -- reads -------------------------------------------------------------------------

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        return self.get_versioned(key, max_bytes=max_bytes)[0]

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """Read the object: one ranged GET of the first part (of at most ``max_bytes`` + 1
        bytes, so an oversized object is refused from that answer's ``Content-Range``),
        and, as soon as its headers are in, the remaining parts in parallel, each
        conditional on the first part's ETag; every part is read straight into the
        returned ``bytes``."""
        found = self._download(key, max_bytes, None)
        return found.data, found.etag

    def get_stamped(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]:
        """:meth:`get_versioned`, and the ``Last-Modified`` of the same answer (``StampedGet``)."""
        found = self._download(key, max_bytes, None)
        info = ObjectInfo(len(found.data), found.etag, modified_at=found.modified_at, modified_resolution_s=1.0)
        return found.data, info

    def get_hashed(self, key: str, digest: DigestName, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """:meth:`get`, and the hex ``digest`` of the bytes returned, computed while they
        arrive (:class:`gradientmail.mailbox.base.HashingGet`): the parts are hashed in order
        as each stretch from the start completes, so the checksum ends with the download."""
        found = self._download(key, max_bytes, functools.partial(new_hasher, check_digest_name(digest)))
        return found.data, found.digest

    def _download(self, key: str, max_bytes: int | None, hasher: Callable[[], Hasher] | None) -> _s3_transfer.Downloaded:
        """Bytes, ETag, (with ``hasher``) the hex digest and the stamp of the object at ``key``."""
        object_key = self._object_key(key)
        allowance = as_max_bytes(max_bytes)
        try:
            with self._translating("GetObject", object_key):
                client, executor = self._client(), self._executor()
                where = {"bucket": self._bucket, "key": object_key}
                part_bytes, attempts = self._tuning.part_size_bytes, self._tuning.max_attempts
                return _s3_transfer.download(
                    client, executor, **where, part_bytes=part_bytes, max_attempts=attempts, max_bytes=allowance, hasher=hasher
                )
        except _s3_transfer.TooLarge as exc:
            raise too_large(key, self.url, exc.size, exc.max_bytes) from None

    def head(self, key: str) -> ObjectInfo | None:
        response = self._head_object(self._object_key(key))
        if response is None:
            return None
        modified = response.get("LastModified")  # botocore parses the HTTP date: whole seconds
        return ObjectInfo(
            size=int(response["ContentLength"]),
            token=str(response["ETag"]),
            modified_at=modified.timestamp() if modified is not None else None,
            modified_resolution_s=1.0,
        )

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        keys: list[str] = []
        with self._translating("ListObjectsV2", self._root + prefix):
            paginator = self._client().get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=self._root + prefix):
                for entry in page.get("Contents", ()):
                    key = entry["Key"][len(self._root) :]
                    if is_valid_key(key):
                        keys.append(key)
        return sorted(keys)

    # -- writes ------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> str:
        return self._put(key, data, None)[0]

    def put_hashed(self, key: str, data: bytes | Gathered, digest: DigestName) -> tuple[str, str]:
        """:meth:`put`, and the hex ``digest`` of ``data`` (:class:`gradientmail.mailbox.base.HashingPut`;
        a :class:`Gathered` payload's parts are sent out of its pieces, no joined copy), the one
        hash of the upload. A single PutObject of a sha256 blob carries it as
        ``x-amz-checksum-sha256``, which the server checks against the body it received
        (``BadDigest`` refuses a body damaged on the way); S3 knows no BLAKE3, so a BLAKE3 blob's
        body is guarded on the way as every multipart part is. A multipart upload hashes in this
        thread while its parts are sent (S3 has no whole-object digest for parts: TLS, or TCP over
        http, guards them, and every reader checks the reference's digest)."""
        return self._put(key, data, check_digest_name(digest))

    def _put(self, key: str, data: bytes | Gathered, digest: DigestName | None) -> tuple[str, str]:
        object_key = self._object_key(key)
        payload = data if isinstance(data, Gathered) else as_payload(data)
        try:
            return self._write("PutObject", object_key, payload, {}, hashed=digest)
        except _PreconditionFailed as exc:  # only a vanished multipart upload gets here
            raise MailboxUnavailable(f"S3 upload of s3://{self._bucket}/{object_key} vanished; retry") from exc

    def create(self, key: str, data: bytes) -> str:
        object_key = self._object_key(key)
        payload = as_payload(data)
        self._check_conditional_writes()
        try:
            return self._write("PutObject (create-once)", object_key, payload, {"IfNoneMatch": "*"})[0]
        except _PreconditionFailed as exc:
            raise RecordExists(f"mailbox key {key!r} already exists in {self.url}") from exc

    def swap(self, key: str, data: bytes, expected_token: str) -> str:
        object_key = self._object_key(key)
        payload = as_payload(data)
        token = as_token(expected_token)
        self._check_conditional_writes()
        try:
            return self._write("PutObject (swap)", object_key, payload, {"IfMatch": token})[0]
        except _PreconditionFailed as exc:
            if self._head_object(object_key) is None:
                raise KeyNotFound(f"mailbox key {key!r} not found in {self.url}") from exc
            raise VersionConflict(f"mailbox key {key!r} changed since its token was read") from exc

    def delete(self, key: str) -> None:
        object_key = self._object_key(key)
        with self._translating("DeleteObject", object_key):
            try:
                self._client().delete_object(Bucket=self._bucket, Key=object_key)
            except Exception as exc:
                if not (hasattr(exc, "response") and error_code(exc) == "NoSuchKey"):
                    raise

    def close(self) -> None:
        with self._lock:
            client, self._client_obj = self._client_obj, None
            executor, self._executor_obj = self._executor_obj, None
        if executor is not None:
            executor.shutdown(wait=True)
        if client is not None:
            client.close()

    # -- helpers -----------------------------------------------------------------------

    def _object_key(self, key: str) -> str:
        return self._root + validate_key(key)

    def _client(self) -> Any:
        """The boto3 client, created on first use (boto3 sessions are not thread-safe)."""
        client = self._client_obj
        if client is not None:
            return client
        with self._lock:
            if self._client_obj is None:
                self._client_obj = self._make_client()
            return self._client_obj

    def _make_client(self) -> Any:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise MailboxMisconfigured(f"the S3 mailbox needs boto3: {install_hint('s3')}") from exc
        tuning = self._tuning
        s3_options: Any = {"payload_signing_enabled": False}  # botocore's _S3Dict
        if self._addressing_style:
            s3_options["addressing_style"] = self._addressing_style
        # One hash per byte (docs/protocol.md, "Integrity"): botocore would hash every body again,
        # a CRC32 by default and, over http, the sha256 of SigV4 payload signing, and check a CRC
        # of every download. Blobs carry the run's digest instead (put_hashed: a sha256 checked by
        # the server; get_hashed: checked against the record); headers stay signed.
        config = Config(
            retries={"total_max_attempts": tuning.max_attempts, "mode": "standard"},
            connect_timeout=tuning.connect_timeout_s,
            read_timeout=tuning.read_timeout_s,
            max_pool_connections=max(10, tuning.max_concurrency + 4),
            s3=s3_options,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            user_agent_extra="gradientmail",
        )
        access_key_id, secret_access_key, session_token = self._credentials
        with self._translating("client setup", None):
            session = self._session or boto3.Session(
                botocore_session=_botocore_session(),
                profile_name=self._profile,
                aws_access_key_id=access_key_id,
                aws_secret_access_key=secret_access_key,
                aws_session_token=session_token,
            )
            try:
                return session.client("s3", endpoint_url=self._endpoint_url, region_name=self._region, config=config)
            except ValueError as exc:  # botocore rejects a malformed endpoint this way
                raise MailboxMisconfigured(f"S3 endpoint {self._endpoint_url!r} is not usable: {exc}") from exc

    def _executor(self) -> ThreadPoolExecutor:
        executor = self._executor_obj
        if executor is not None:
            return executor
        with self._lock:
            if self._executor_obj is None:
                self._executor_obj = ThreadPoolExecutor(
                    max_workers=self._tuning.max_concurrency, thread_name_prefix="gradientmail-s3"
                )
            return self._executor_obj

    @contextmanager
    def _translating(self, operation: str, object_key: str | None) -> Iterator[None]:
        """Turn any botocore or transport exception raised inside into our error."""
        try:
            yield
        except MailboxError:
            raise
        except Exception as exc:
            if not is_transport_error(exc):
                raise
            raise translate(exc, operation=operation, bucket=self._bucket, object_key=object_key, endpoint=self.endpoint) from exc

    def _write(
        self,
        operation: str,
        object_key: str,
        payload: bytes | Gathered,
        conditions: dict[str, str],
        *,
        hashed: DigestName | None = None,
    ) -> tuple[str, str]:
        """Upload under ``conditions`` with a fresh writer nonce; return the ETag and (``hashed``)
        the payload's hex digest of that kind, else "". Every single PutObject of a record, or of
        a sha256 blob, carries the payload's sha256 for the server to check (a create-once record
        damaged on the way must not be stored); a multipart upload takes the digest only when
        ``hashed``.

        Raises ``_PreconditionFailed`` when the store refused the condition (or lost the
        multipart upload) and the object there does not carry our nonce.
        """
        nonce = uuid.uuid4().hex
        # a record's, or a blob's by the digest asked for: taken for a single PutObject, or when asked
        digest = _s3_transfer.PayloadDigest(payload, hashed or "sha256")
        for attempt in range(1, self._tuning.max_attempts + 1):
            with self._translating(operation, object_key):
                try:
                    etag = _s3_transfer.upload(
                        self._client(),
                        self._executor(),
                        bucket=self._bucket,
                        key=object_key,
                        data=payload,
                        threshold_bytes=self._tuning.multipart_threshold_bytes,
                        part_bytes=self._tuning.part_size_bytes,
                        metadata={NONCE_METADATA: nonce},
                        conditions=conditions,
                        digest=digest,
                        hash_parts=hashed is not None,
                    )
                    return etag, digest.hex() if hashed is not None else ""
                except Exception as exc:
                    if not is_transport_error(exc) or not hasattr(exc, "response"):
                        raise
                    code, status = error_code(exc), http_status(exc)
                    if code in ("PreconditionFailed", "NoSuchUpload") or status == 412:
                        landed = self._own_etag(object_key, nonce)
                        if landed is not None:  # our earlier attempt landed; its response was lost
                            return landed, digest.hex() if hashed is not None else ""
                        raise _PreconditionFailed(code) from exc
                    if code == "ConditionalRequestConflict" and attempt < self._tuning.max_attempts:
                        _s3_transfer.backoff(attempt)  # a concurrent conditional write; retry
                        continue
                    raise
        raise MailboxUnavailable(f"S3 {operation} of s3://{self._bucket}/{object_key} kept conflicting")

    def _own_etag(self, object_key: str, nonce: str) -> str | None:
        """The ETag of the object if it carries ``nonce`` (we wrote it), else None."""
        response = self._head_object(object_key)
        if response is None or response.get("Metadata", {}).get(NONCE_METADATA) != nonce:
            return None
        return str(response["ETag"])

    def _head_object(self, object_key: str) -> dict[str, Any] | None:
        """HeadObject, or None for a missing object (once per mailbox, a 404 also checks
        that the bucket exists, since HEAD cannot tell a missing key from a missing bucket)."""
        with self._translating("HeadObject", object_key):
            try:
                return self._client().head_object(Bucket=self._bucket, Key=object_key)  # type: ignore[no-any-return]
            except Exception as exc:
                if not is_transport_error(exc) or not hasattr(exc, "response") or http_status(exc) != 404:
                    raise
            self._check_bucket()
            return None

    def _check_bucket(self) -> None:
        if self._bucket_checked:
            return
        with self._translating("HeadBucket", None):
            try:
                self._client().head_bucket(Bucket=self._bucket)
            except Exception as exc:
                if not is_transport_error(exc) or not hasattr(exc, "response"):
                    raise
                if http_status(exc) == 404:
                    raise MailboxMisconfigured(f"bucket {self._bucket!r} does not exist at {self.endpoint}") from exc
                # 403 and the like: we may not be allowed to ask; the objects answer for themselves.
        self._bucket_checked = True

    def _check_conditional_writes(self) -> None:
        """Once per mailbox, prove on a scratch key that the store enforces
        If-None-Match and If-Match (see ``S3Tuning.verify_conditional_writes``)."""
        if self._conditions_checked or not self._tuning.verify_conditional_writes:
            return
        client = self._client()
        probe_key = f"{self._root}{_PROBE_PREFIX}{uuid.uuid4().hex}"
        ignored: list[str] = []
        with self._translating("PutObject (checking conditional writes)", probe_key):
            try:
                # a plain put: the key is fresh, and a retried put whose first response was lost
                # must not fail the check (a conditional one would answer 412 to its own write)
                client.put_object(Bucket=self._bucket, Key=probe_key, Body=b"first")
                probes = (
                    ("If-None-Match", {"IfNoneMatch": "*"}),
                    ("If-Match", {"IfMatch": '"gradientmail-probe-never-matches"'}),
                )
                for header, condition in probes:
                    try:
                        client.put_object(Bucket=self._bucket, Key=probe_key, Body=b"second", **condition)
                        ignored.append(header)
                    except Exception as exc:
                        if not (hasattr(exc, "response") and http_status(exc) == 412):
                            raise
            finally:
                client.delete_object(Bucket=self._bucket, Key=probe_key)
        if ignored:
            raise MailboxMisconfigured(
                f"the S3 store at {self.endpoint} ignores {' and '.join(ignored)} on writes to bucket "
                f"{self._bucket!r}; GradientMail needs conditional writes for its create-once commits"
            )
        self._conditions_checked = True
