"""Parallel multipart uploads and ranged downloads for the S3 store.

boto3's transfer manager (``upload_fileobj``/``TransferConfig``) parallelises transfers but
accepts neither ``IfNoneMatch`` nor ``IfMatch`` for uploads, and create-once and
compare-and-swap of large fragments need exactly those on ``CompleteMultipartUpload``.
So this module drives the multipart API itself on a thread pool: the parts go up in
parallel and the condition is checked once, atomically, when the upload is completed.
Downloads ask for the first part, learn size and ETag from its headers, and fetch the
rest in parallel with ``IfMatch`` on that ETag while the first body streams in, so the
pieces always belong to one version. Every part is read straight into its place in the
``bytes`` that is returned (:func:`_assemble`): no part is joined or copied afterwards.
A reader with an allowance (``max_bytes``) asks for at most ``max_bytes + 1`` bytes first
and refuses a larger object from that response's headers, before reading any body.
:func:`download` with a hasher also hashes the object while it arrives: the calling thread feeds
the hash each contiguous stretch from the start as soon as all its parts are in, while the
later parts still stream (issue 13: the checksum costs no pass of its own).

Everything here raises botocore's exceptions (and :class:`TooLarge`); the caller translates them.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import math
import random
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Executor, Future, wait
from typing import Any, NamedTuple, TypeVar

from gradientmail.digests import DigestName, Hasher
from gradientmail.errors import MailboxUnavailable
from gradientmail.mailbox._content import read_at_most
from gradientmail.mailbox._s3_errors import error_code, http_status, stream_errors
from gradientmail.mailbox.base import Gathered, joined

__all__ = [
    "MAX_PARTS",
    "MIN_PART_BYTES",
    "Downloaded",
    "TooLarge",
    "download",
    "run_all",
    "upload",
]

MIN_PART_BYTES = 5 * 1024 * 1024
"""S3's smallest allowed part (all but the last)."""
MAX_PARTS = 10_000
"""S3's largest part count; bigger payloads get bigger parts."""
_READ_RESTARTS = 3
"""How often a download restarts when the object is replaced while it is being read."""
_READ_CHUNK_BYTES = 1024 * 1024
"""Bytes per ``readinto`` of a response body (urllib3 reads each into a temporary
``bytes`` first): small enough that the allocator reuses those temporaries instead of
mapping fresh pages each time, large enough to keep the calls few."""

T = TypeVar("T")


class TooLarge(Exception):
    """The object is larger than the reader's allowance ``max_bytes``; ``size`` is None when
    the store did not say how large (the caller turns this into ``ObjectTooLarge`` with
    the mailbox key)."""

    def __init__(self, size: int | None, max_bytes: int) -> None:
        super().__init__(size, max_bytes)
        self.size = size
        self.max_bytes = max_bytes


def run_all(executor: Executor, tasks: Sequence[Callable[[], T]], *, here: Callable[[], object] | None = None) -> list[T]:
    """Run ``tasks`` on ``executor`` (and ``here``, if given, in the calling thread
    meanwhile); return their results in order or raise the first failure once nothing is
    running any more. No task outlives the call, even one interrupted by a signal: the
    downloads write into a buffer that must not be freed while a task still writes."""
    futures: list[Future[T]] = []
    try:
        futures.extend(executor.submit(task) for task in tasks)
        if here is not None:
            here()
        wait(futures, return_when=FIRST_EXCEPTION)
    finally:
        for future in futures:
            future.cancel()
        _wait_out(futures)
    for future in futures:
        failure = None if future.cancelled() else future.exception()
        if failure is not None:
            raise failure
    return [future.result() for future in futures]


def _wait_out(futures: list[Future[T]]) -> None:
    """Wait until every future is done or cancelled, whatever interrupts the wait."""
    interrupted: BaseException | None = None
    while True:
        try:
            wait(futures)
            break
        except BaseException as exc:  # e.g. a second Ctrl-C: still wait, then re-raise
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


def backoff(attempt: int) -> None:
    """Sleep with full jitter before retry ``attempt`` (1-based), at most 2 s."""
    time.sleep(random.random() * min(2.0, 0.05 * 2**attempt))


class PayloadDigest:
    """The digest ``name`` of one payload, taken once however many attempts upload it."""

    def __init__(self, data: bytes | Gathered, name: DigestName) -> None:
        self._data = data
        self.name: DigestName = name
        self._digest: bytes | None = None

    def digest(self) -> bytes:
        if self._digest is None:
            data = self._data
            self._digest = (data if isinstance(data, Gathered) else Gathered([data])).digest(self.name)
        return self._digest

    def hex(self) -> str:
        return self.digest().hex()

    def checksum(self) -> dict[str, str]:
        """The digest as the PutObject argument S3 checks the body against (``ChecksumSHA256``,
        base64), or none for a digest S3 does not know (BLAKE3)."""
        if self.name != "sha256":
            return {}
        return {"ChecksumSHA256": base64.b64encode(self.digest()).decode("ascii")}


class PartBody:
    """One part's body, read straight out of the payload's buffers (no copy): a seekable
    file-like object, which botocore sizes with ``len`` and rewinds with ``seek(0)`` for a retry,
    and whose ``read`` returns views the socket sends as they are. Measured against a ``bytes``
    slice per part (one copy): 256 MB in 8 MB parts took 0.34 client CPU-s against 0.42
    (docs/benchmarks-log.md, "One syncer round")."""

    def __init__(self, part: Gathered) -> None:
        self._part = part
        self._size = len(part)
        self._position = 0

    def __len__(self) -> int:
        return self._size

    def read(self, size: int | None = -1) -> memoryview | bytes:
        """Up to ``size`` bytes from the position (all when negative or None), as a view when
        they lie in one piece."""
        end = self._size if size is None or size < 0 else min(self._size, self._position + size)
        if end <= self._position:
            return b""
        views = self._part.between(self._position, end)
        self._position = end
        return views[0] if len(views) == 1 else b"".join(views)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, min(self._size, base + offset))
        return self._position

    def tell(self) -> int:
        return self._position

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


def upload(
    client: Any,
    executor: Executor,
    *,
    bucket: str,
    key: str,
    data: bytes | Gathered,
    threshold_bytes: int,
    part_bytes: int,
    metadata: dict[str, str],
    conditions: dict[str, str],
    digest: PayloadDigest | None = None,
    hash_parts: bool = False,
) -> str:
    """Store ``data`` at ``key`` under ``conditions`` (``IfNoneMatch``/``IfMatch``) and
    return the new ETag. At most ``threshold_bytes`` go in one ``PutObject`` (a gathered
    payload joined); above it, a multipart upload with parts of ``part_bytes`` sent in
    parallel, each read straight out of ``data``'s buffers (:class:`PartBody`). With
    ``digest``, a single PutObject sends it for the server to check, and a multipart upload
    takes it in this thread while the parts are sent when ``hash_parts``."""
    if len(data) <= threshold_bytes:
        checksum = digest.checksum() if digest is not None else {}
        body = joined(data)
        response = client.put_object(Bucket=bucket, Key=key, Body=body, Metadata=metadata, **checksum, **conditions)
        return str(response["ETag"])
    gathered = data if isinstance(data, Gathered) else Gathered([data])
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
            "Body": PartBody(Gathered(gathered.between(start, start + part_bytes))),
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
        tasks = [functools.partial(send, n, s) for n, s in enumerate(starts, start=1)]
        parts = run_all(executor, tasks, here=digest.digest if digest is not None and hash_parts else None)
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


class Downloaded(NamedTuple):
    """One version of an object, read whole."""

    data: bytes
    etag: str
    digest: str
    """The hex digest of ``data`` when a hasher was given, else ""."""
    modified_at: float | None
    """The first answer's ``Last-Modified`` (whole seconds since the epoch); None if it had none."""


def download(
    client: Any,
    executor: Executor,
    *,
    bucket: str,
    key: str,
    part_bytes: int,
    max_attempts: int,
    max_bytes: int | None = None,
    hasher: Callable[[], Hasher] | None = None,
) -> Downloaded:
    """Return the object's bytes, ETag and ``Last-Modified``, fetching parts of ``part_bytes``
    in parallel.

    The first ranged GET says the size; the other parts are requested as soon as its
    headers are in, so its body streams while they do, and every part is read straight
    into its place in the result (see :func:`_assemble`): no part is copied again.
    Raises ``TooLarge`` for an object over ``max_bytes`` (None: any size) having read at
    most ``max_bytes + 1`` bytes of it. With ``hasher``, also the hex digest of the bytes
    returned by a fresh ``hasher()`` fed while they arrive: each contiguous stretch from the
    start is hashed (on the calling thread) as soon as every part of it is in, while later
    parts still stream. A restart (the object was replaced meanwhile) starts a new hash; the
    digest is always that of exactly the bytes returned.
    """
    for _ in range(_READ_RESTARTS):
        found = _download_one_version(
            client,
            executor,
            bucket=bucket,
            key=key,
            part_bytes=part_bytes,
            max_attempts=max_attempts,
            max_bytes=max_bytes,
            hasher=hasher,
        )
        if found is not None:
            return found
    raise MailboxUnavailable(f"s3://{bucket}/{key} kept changing while it was being read")


class _Progress:
    """Which parts of a download are in (written whole), for hashing contiguous stretches in order."""

    def __init__(self, bounds: list[tuple[int, int]]) -> None:
        self.bounds = bounds
        self._done = [False] * len(bounds)
        self._failed = False
        self._ready = threading.Condition()

    def done(self, index: int) -> None:
        with self._ready:
            self._done[index] = True
            self._ready.notify_all()

    def failed(self) -> None:
        with self._ready:
            self._failed = True
            self._ready.notify_all()

    def hash_into(self, view: memoryview, hasher: Hasher) -> bool:
        """Feed ``hasher`` every part in order, each stretch as soon as it is complete; False
        (hashing abandoned) when a part failed."""
        first = 0
        count = len(self.bounds)
        while first < count:
            with self._ready:
                while not self._done[first] and not self._failed:
                    self._ready.wait()
                if self._failed:
                    return False
                last = first
                while last + 1 < count and self._done[last + 1]:
                    last += 1
            with view[self.bounds[first][0] : self.bounds[last][1]] as stretch:
                hasher.update(stretch)  # hashlib releases the GIL: the parts keep streaming
            first = last + 1
        return True


def _download_one_version(
    client: Any,
    executor: Executor,
    *,
    bucket: str,
    key: str,
    part_bytes: int,
    max_attempts: int,
    max_bytes: int | None,
    hasher: Callable[[], Hasher] | None = None,
) -> Downloaded | None:
    """Read the current version whole (and its digest when ``hasher`` is given, else ""),
    or return None if it was replaced meanwhile."""
    from botocore.exceptions import ClientError

    # With an allowance, one byte more than allowed is enough to tell "too large" even
    # from a store that reports no size.
    first_bytes = part_bytes if max_bytes is None else min(part_bytes, max_bytes + 1)
    attempt = 0
    while True:
        attempt += 1
        response = _open(client, {"Bucket": bucket, "Key": key, "Range": f"bytes=0-{first_bytes - 1}"})
        body = response["Body"]
        in_parts = False
        try:
            etag = str(response["ETag"])
            modified = response.get("LastModified")  # botocore parses the HTTP date: whole seconds
            modified_at = modified.timestamp() if modified is not None else None
            declared = _declared_size(response)
            if max_bytes is not None and declared is not None and declared > max_bytes:
                raise TooLarge(declared, max_bytes)
            span = _content_range(response)
            total = span[2] if span is not None else None
            if span is not None and total is not None and total > span[1] + 1:
                in_parts = True
                break
            # The whole object is in this answer: it is small, the store ignored the range,
            # or (an empty object) it was asked for whole. Read it as it comes.
            try:
                data = _read_whole(body, response, max_bytes, first_bytes)
            except stream_errors() as exc:
                if attempt >= max_attempts:
                    raise
                _forget_locals(exc)
            else:
                if hasher is None:
                    return Downloaded(data, etag, "", modified_at)
                whole = hasher()
                whole.update(data)
                return Downloaded(data, etag, whole.hexdigest(), modified_at)
            backoff(attempt)
        finally:
            if not in_parts:
                body.close()  # drops the connection if the body was left unread
    end = span[1]
    if span[0] != 0 or _length_of(response) != end + 1:
        body.close()
        raise MailboxUnavailable(f"S3 answered range 0-{first_bytes - 1} of {key!r} with {response.get('ContentRange')!r}")
    offsets = range(end + 1, total, part_bytes)
    progress = _Progress([(0, end + 1)] + [(offset, min(offset + part_bytes, total)) for offset in offsets])
    digest = hasher() if hasher is not None else None

    def fill(view: memoryview) -> None:
        """Write the object into ``view``: part one from the open answer, here, the rest
        on the executor at the same time, each conditional on the first part's ETag; then,
        with a hasher, hash the parts here in order as they complete."""

        def first_part() -> None:
            with view[: end + 1] as part:
                try:
                    _read_into(body, part)
                    return
                except stream_errors() as exc:
                    if max_attempts <= 1:
                        raise
                    _forget_locals(exc)
                finally:
                    body.close()
                # The answer broke off: fetch part one again, of this version only.
                params = {"Bucket": bucket, "Key": key, "Range": f"bytes=0-{end}", "IfMatch": etag}
                _fetch_into(client, params, part, max_attempts - 1, first_attempt=2)

        def fetch(index: int, offset: int) -> None:
            last = min(offset + part_bytes, total) - 1
            params = {"Bucket": bucket, "Key": key, "Range": f"bytes={offset}-{last}", "IfMatch": etag}
            try:
                with view[offset : last + 1] as part:
                    _fetch_into(client, params, part, max_attempts)
            except BaseException:
                progress.failed()
                raise
            progress.done(index)

        def here() -> None:
            try:
                first_part()
            except BaseException:
                progress.failed()
                raise
            progress.done(0)
            if digest is not None:
                progress.hash_into(view, digest)

        rest = [functools.partial(fetch, index, offset) for index, offset in enumerate(offsets, start=1)]
        run_all(executor, rest, here=here)

    try:
        data = _assemble(total, fill)
    except ClientError as exc:
        if error_code(exc) == "PreconditionFailed" or http_status(exc) == 412:
            return None  # replaced while we read it: the caller starts again on the new version
        raise
    finally:
        body.close()
    return Downloaded(data, etag, digest.hexdigest() if digest is not None else "", modified_at)


def _open(client: Any, params: dict[str, Any]) -> dict[str, Any]:
    """GetObject, up to the headers; an empty object (which has no byte 0 for a range)
    is asked for again whole."""
    from botocore.exceptions import ClientError

    try:
        return client.get_object(**params)  # type: ignore[no-any-return]
    except ClientError as exc:
        if error_code(exc) == "InvalidRange" and "IfMatch" not in params:
            return client.get_object(**{name: value for name, value in params.items() if name != "Range"})  # type: ignore[no-any-return]
        raise


def _read_whole(body: Any, response: dict[str, Any], max_bytes: int | None, asked: int) -> bytes:
    """The body of an answer that holds the whole object (headers already checked against
    ``max_bytes``); never more than ``max_bytes + 1`` bytes are read."""
    span = _content_range(response)
    if span is not None and span[2] is None and span[1] + 1 >= asked:
        raise MailboxUnavailable("S3 did not state the object's size (Content-Range: bytes a-b/*)")
    if max_bytes is None:
        data: bytes = body.read()
    else:
        data = read_at_most(body, max_bytes + 1)
        if len(data) > max_bytes:
            raise TooLarge(None, max_bytes)  # a store that ignored the range and sent no length
    if span is not None and (span[0] != 0 or len(data) != span[1] + 1):
        raise MailboxUnavailable(f"S3 answered the start of an object with {len(data)} bytes of {response.get('ContentRange')!r}")
    return data


def _fetch_into(client: Any, params: dict[str, Any], view: memoryview, max_attempts: int, *, first_attempt: int = 1) -> None:
    """GetObject the range ``params`` names into ``view`` (exactly its length), retrying
    when the body breaks off mid-stream (botocore retries the request itself, but not a
    body that fails after the headers arrived)."""
    attempt = first_attempt - 1
    while True:
        attempt += 1
        response = client.get_object(**params)
        body = response["Body"]
        try:
            length = _length_of(response)
            if length != len(view):
                raise MailboxUnavailable(f"S3 answered {params['Range']} of {params['Key']!r} with {length} bytes")
            _read_into(body, view)
            return
        except stream_errors() as exc:
            if attempt >= max_attempts + first_attempt - 1:
                raise
            _forget_locals(exc)
            backoff(attempt)
        finally:
            body.close()  # drops the connection if the body was left unread


def _read_into(body: Any, view: memoryview) -> None:
    """Fill ``view`` from ``body`` (botocore's ``StreamingBody``), in chunks that reuse the
    allocator's memory. A body that ends early raises botocore's ``IncompleteReadError``
    (a stream error: the caller asks again), never leaves part of ``view`` unwritten."""
    size = len(view)
    done = 0
    while done < size:
        with view[done : min(size, done + _READ_CHUNK_BYTES)] as chunk:
            count = body.readinto(chunk)
        if not count:
            from botocore.exceptions import IncompleteReadError

            raise IncompleteReadError(actual_bytes=done, expected_bytes=size)
        done += count


class _Filler(io.RawIOBase):
    """A raw stream whose one read is the whole object, written by ``fill``."""

    def __init__(self, size: int, fill: Callable[[memoryview], None]) -> None:
        super().__init__()
        self._size = size
        self._fill = fill
        self._position = 0
        self._spare: bytearray | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._size - self._position
        with memoryview(buffer) as target, target.cast("B") as view:
            if left <= 0:
                return 0
            if self._position == 0 and len(view) == self._size:
                self._fill(view)  # CPython: the view is the result's own memory
                self._position = self._size
                return self._size
            # A runtime that reads in windows: assemble once aside, then hand it out.
            if self._spare is None:
                self._spare = bytearray(self._size)
                with memoryview(self._spare) as spare:
                    self._fill(spare)
            count = min(len(view), left)
            view[:count] = self._spare[self._position : self._position + count]
            self._position += count
            return count


def _assemble(size: int, fill: Callable[[memoryview], None]) -> bytes:
    """A ``bytes`` of ``size`` that ``fill`` writes in place, through a writable view.

    ``io.BufferedReader.read(n)`` allocates the ``bytes`` it returns and hands its raw
    stream a writable view of that very memory (buffer size 1: all of it in one
    ``readinto``), which is how CPython fills a new ``bytes`` without a second copy;
    ``fill`` writes the parts there from several threads. Elsewhere the same code is
    correct and merely copies once. ``fill`` must not return or raise while anything
    still writes into the view (``run_all`` waits for every task); every view of it is
    released before the ``bytes`` is handed out, and on failure the frames of the
    traceback drop theirs, so nothing can reach the freed memory afterwards.
    """
    try:
        data = io.BufferedReader(_Filler(size, fill), buffer_size=1).read(size)
    except BaseException as exc:
        _forget_locals(exc)  # the frames below hold views of the buffer, now freed
        raise
    if len(data) != size:  # cannot happen: readinto returns all of it or raises
        raise MailboxUnavailable(f"assembled {len(data)} of {size} bytes")
    return data


def _forget_locals(exc: BaseException) -> None:
    """Drop the local variables of the frames ``exc`` (and what it chains) passed through:
    they may hold views of a result buffer that is freed once the read gives up."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


def _content_range(response: dict[str, Any]) -> tuple[int, int, int | None] | None:
    """``(first, last, total)`` of ``Content-Range: bytes first-last/total`` (total None
    for ``*``), or None when the answer has no (readable) range."""
    text = response.get("ContentRange") or ""
    unit, _, rest = text.partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    if unit != "bytes" or not first.isdigit() or not last.isdigit() or not (total.isdigit() or total == "*"):
        return None
    return int(first), int(last), int(total) if total.isdigit() else None


def _length_of(response: dict[str, Any]) -> int | None:
    length = response.get("ContentLength")
    return int(length) if length is not None else None


def _declared_size(response: dict[str, Any]) -> int | None:
    """The whole object's size as the response headers state it: the total of
    ``Content-Range`` for a partial answer, ``Content-Length`` for a whole one."""
    total = (response.get("ContentRange") or "").rpartition("/")[2]
    if total.isdigit():
        return int(total)
    if response.get("ContentRange"):
        return None  # "bytes a-b/*": the store does not know the size
    return _length_of(response)
