"""Parallel multipart uploads and ranged downloads for the S3 store.

boto3's transfer manager (``upload_fileobj``/``TransferConfig``) parallelises transfers but
accepts neither ``IfNoneMatch`` nor ``IfMatch`` for uploads, and create-once and
compare-and-swap of large fragments need exactly those on ``CompleteMultipartUpload``.
So this module drives the multipart API itself on a thread pool: the parts go up in
parallel and the condition is checked once, atomically, when the upload is completed.
Downloads fetch the first part, learn size and ETag from it, and fetch the rest in
parallel with ``IfMatch`` on that ETag, so the pieces always belong to one version. A
reader with an allowance (``max_bytes``) asks for at most ``max_bytes + 1`` bytes first
and refuses a larger object from that response's headers, before reading further.

Everything here raises botocore's exceptions (and :class:`TooLarge`); the caller translates them.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Executor, wait
from typing import Any, TypeVar

from gradientmail.errors import MailboxUnavailable
from gradientmail.mailbox._content import read_at_most
from gradientmail.mailbox._s3_errors import error_code, http_status, stream_errors

__all__ = ["MAX_PARTS", "MIN_PART_BYTES", "TooLarge", "download", "run_all", "upload"]

MIN_PART_BYTES = 5 * 1024 * 1024
"""S3's smallest allowed part (all but the last)."""
MAX_PARTS = 10_000
"""S3's largest part count; bigger payloads get bigger parts."""
_READ_RESTARTS = 3
"""How often a download restarts when the object is replaced while it is being read."""

T = TypeVar("T")


class TooLarge(Exception):
    """The object is larger than the reader's allowance ``max_bytes``; ``size`` is None when
    the store did not say how large (the caller turns this into ``ObjectTooLarge`` with
    the mailbox key)."""

    def __init__(self, size: int | None, max_bytes: int) -> None:
        super().__init__(size, max_bytes)
        self.size = size
        self.max_bytes = max_bytes


def run_all(executor: Executor, tasks: list[Callable[[], T]]) -> list[T]:
    """Run ``tasks`` on ``executor``; return their results in order or raise the first
    failure once nothing is running any more (so no task outlives the call)."""
    futures = [executor.submit(task) for task in tasks]
    _, pending = wait(futures, return_when=FIRST_EXCEPTION)
    if pending:
        for future in pending:
            future.cancel()
        wait(pending)
    return [future.result() for future in futures]


def backoff(attempt: int) -> None:
    """Sleep with full jitter before retry ``attempt`` (1-based), at most 2 s."""
    time.sleep(random.random() * min(2.0, 0.05 * 2**attempt))


def upload(
    client: Any,
    executor: Executor,
    *,
    bucket: str,
    key: str,
    data: bytes,
    threshold_bytes: int,
    part_bytes: int,
    metadata: dict[str, str],
    conditions: dict[str, str],
) -> str:
    """Store ``data`` at ``key`` under ``conditions`` (``IfNoneMatch``/``IfMatch``) and
    return the new ETag. At most ``threshold_bytes`` go in one ``PutObject``; above it,
    a multipart upload with parts of ``part_bytes`` sent in parallel."""
    if len(data) <= threshold_bytes:
        response = client.put_object(Bucket=bucket, Key=key, Body=data, Metadata=metadata, **conditions)
        return str(response["ETag"])
    part_bytes = max(part_bytes, MIN_PART_BYTES, math.ceil(len(data) / MAX_PARTS))
    # Mirror s3transfer: when botocore sends checksums by default, declare the algorithm
    # for the whole upload so every part's checksum can be listed when completing.
    checksum = client.meta.config.request_checksum_calculation == "when_supported"
    create_args: dict[str, Any] = {"Bucket": bucket, "Key": key, "Metadata": metadata}
    if checksum:
        create_args["ChecksumAlgorithm"] = "CRC32"
    upload_id = client.create_multipart_upload(**create_args)["UploadId"]

    def send(part_number: int, start: int) -> dict[str, Any]:
        args: dict[str, Any] = {
            "Bucket": bucket,
            "Key": key,
            "UploadId": upload_id,
            "PartNumber": part_number,
            "Body": data[start : start + part_bytes],
        }
        if checksum:
            args["ChecksumAlgorithm"] = "CRC32"
        response = client.upload_part(**args)
        part = {"PartNumber": part_number, "ETag": response["ETag"]}
        if checksum and "ChecksumCRC32" in response:
            part["ChecksumCRC32"] = response["ChecksumCRC32"]
        return part

    try:
        starts = range(0, len(data), part_bytes)
        parts = run_all(executor, [functools.partial(send, n, s) for n, s in enumerate(starts, start=1)])
        response = client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}, **conditions
        )
        return str(response["ETag"])
    except BaseException:
        # Do not leave billed, invisible parts behind. If the completion did succeed and
        # only its response was lost, the upload id is gone and this abort is a no-op.
        with contextlib.suppress(Exception):  # best effort; the original error matters
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise


def download(
    client: Any,
    executor: Executor,
    *,
    bucket: str,
    key: str,
    part_bytes: int,
    max_attempts: int,
    max_bytes: int | None = None,
) -> tuple[bytes, str]:
    """Return the object's bytes and ETag, fetching parts of ``part_bytes`` in parallel.

    Raises ``TooLarge`` for an object over ``max_bytes`` (None: any size) having read at
    most ``max_bytes + 1`` bytes of it.
    """
    for _ in range(_READ_RESTARTS):
        found = _download_one_version(
            client, executor, bucket=bucket, key=key, part_bytes=part_bytes, max_attempts=max_attempts, max_bytes=max_bytes
        )
        if found is not None:
            return found
    raise MailboxUnavailable(f"s3://{bucket}/{key} kept changing while it was being read")


def _download_one_version(
    client: Any, executor: Executor, *, bucket: str, key: str, part_bytes: int, max_attempts: int, max_bytes: int | None
) -> tuple[bytes, str] | None:
    """Read the current version whole, or return None if it was replaced meanwhile."""
    from botocore.exceptions import ClientError

    # With an allowance, one byte more than allowed is enough to tell "too large" even
    # from a store that reports no size.
    first_bytes = part_bytes if max_bytes is None else min(part_bytes, max_bytes + 1)
    first, response = _get(
        client, {"Bucket": bucket, "Key": key, "Range": f"bytes=0-{first_bytes - 1}"}, max_attempts, max_bytes=max_bytes
    )
    etag = str(response["ETag"])
    total = _total_size(response, len(first))
    if max_bytes is not None and total > max_bytes:
        raise TooLarge(total, max_bytes)
    if total <= len(first):
        return first, etag
    buffer = bytearray(total)
    buffer[: len(first)] = first

    def fetch(start: int) -> None:
        end = min(start + part_bytes, total) - 1
        params = {"Bucket": bucket, "Key": key, "Range": f"bytes={start}-{end}", "IfMatch": etag}
        body, _ = _get(client, params, max_attempts)
        if len(body) != end - start + 1:
            raise MailboxUnavailable(f"S3 returned {len(body)} bytes for range {start}-{end} of {key!r}")
        buffer[start : end + 1] = body

    try:
        run_all(executor, [functools.partial(fetch, start) for start in range(len(first), total, part_bytes)])
    except ClientError as exc:
        if error_code(exc) == "PreconditionFailed" or http_status(exc) == 412:
            return None  # replaced while we read it: the caller starts again on the new version
        raise
    return bytes(buffer), etag


def _get(client: Any, params: dict[str, Any], max_attempts: int, *, max_bytes: int | None = None) -> tuple[bytes, dict[str, Any]]:
    """GetObject and read its body, retrying when the body breaks off mid-stream (botocore
    retries the request itself, but not a body that fails after the headers arrived).

    With ``max_bytes``, an object the headers show to be larger raises ``TooLarge`` before
    any of the body is read, and at most ``max_bytes + 1`` body bytes are ever read (a
    store may ignore the range, or answer the unranged retry of an empty object with an
    object that has since been replaced by a huge one).
    """
    from botocore.exceptions import ClientError

    attempt = 0
    while True:
        attempt += 1
        try:
            response = client.get_object(**params)
        except ClientError as exc:
            if error_code(exc) == "InvalidRange" and "IfMatch" not in params:
                # An empty object has no byte 0; ask for it whole.
                params = {name: value for name, value in params.items() if name != "Range"}
                response = client.get_object(**params)
            else:
                raise
        body = response["Body"]
        try:
            if max_bytes is None:
                return body.read(), response
            declared = _declared_size(response)
            if declared is not None and declared > max_bytes:
                raise TooLarge(declared, max_bytes)
            data = read_at_most(body, max_bytes + 1)
            if len(data) > max_bytes:
                raise TooLarge(None, max_bytes)  # a store that ignored the range and sent no length
            return data, response
        except stream_errors():
            if attempt >= max_attempts:
                raise
            backoff(attempt)
        finally:
            body.close()  # drops the connection if the body was left unread


def _declared_size(response: dict[str, Any]) -> int | None:
    """The whole object's size as the response headers state it: the total of
    ``Content-Range`` for a partial answer, ``Content-Length`` for a whole one."""
    total = (response.get("ContentRange") or "").rpartition("/")[2]
    if total.isdigit():
        return int(total)
    if response.get("ContentRange"):
        return None  # "bytes a-b/*": the store does not know the size
    length = response.get("ContentLength")
    return int(length) if length is not None else None


def _total_size(response: dict[str, Any], received: int) -> int:
    """Object size from ``Content-Range: bytes a-b/total``; a store that ignored the
    range sent everything, so the size is what arrived."""
    content_range = response.get("ContentRange") or ""
    total = content_range.rpartition("/")[2]
    return int(total) if total.isdigit() else received
