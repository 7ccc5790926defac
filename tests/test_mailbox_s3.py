"""S3 store specifics against the real loopback SeaweedFS: large transfers, retries of
injected faults, lost responses, and the errors users cause."""

from __future__ import annotations

import hashlib
import io
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import boto3
import numpy as np
import pytest

from gradientmail.errors import (
    CorruptPayload,
    GradientMailError,
    InvalidConfig,
    KeyNotFound,
    MailboxMisconfigured,
    MailboxUnavailable,
    ObjectTooLarge,
    RecordExists,
    VersionConflict,
)
from gradientmail.mailbox import MinioMailbox, S3Mailbox, S3Tuning, open_mailbox
from gradientmail.records import PayloadRef
from gradientmail.store.blobs import Blobs
from tests.s3_faults import FaultInjector, GetObjectWire, LoseRequests, operation_of
from tests.seaweedfs import S3Server

MiB = 1024 * 1024
SMALL_PARTS = S3Tuning(multipart_threshold_bytes=5 * MiB, part_size_bytes=5 * MiB)
"""Multipart from 5 MiB on, so multipart behaviour is tested with small payloads."""

pytestmark = pytest.mark.s3


def _random_bytes(seed: int, size: int) -> bytes:
    """``size`` seeded pseudo-random bytes (fast enough for hundreds of MB)."""
    words = np.random.default_rng(seed).integers(0, 2**64 - 1, -(-size // 8), dtype=np.uint64, endpoint=True)
    return words.tobytes()[:size]


def _session(server: S3Server) -> boto3.Session:
    return boto3.Session(aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key, region_name=server.region)


class CallCounter:
    """Counts API calls by operation, and GetObject calls that asked for a byte range."""

    def __init__(self, events: Any) -> None:
        self.calls: dict[str, int] = {}
        self.ranged_gets = 0
        self._lock = threading.Lock()
        events.register("provide-client-params.s3", self._count)

    def _count(self, params: dict[str, Any], event_name: str, **_: Any) -> None:
        operation = operation_of(event_name)
        with self._lock:
            self.calls[operation] = self.calls.get(operation, 0) + 1
            if operation == "GetObject" and "Range" in params:
                self.ranged_gets += 1


# -- large payloads ------------------------------------------------------------------


@pytest.mark.slow
def test_300_mb_round_trips_through_parallel_multipart(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    session = _session(s3_server)
    counter = CallCounter(session.events)
    mailbox = make_s3_mailbox(session=session)  # default tuning: 16 MiB threshold, 8 MiB parts
    payload = _random_bytes(300, 300 * MiB)
    parts = -(-len(payload) // S3Tuning().part_size_bytes)

    token = mailbox.create("fragments/0000/versions/0000000001/params-a.safetensors", payload)
    assert counter.calls.get("PutObject", 0) == 3  # only the conditional-write check's probes
    assert counter.calls["CreateMultipartUpload"] == 1
    assert counter.calls["UploadPart"] == parts
    assert counter.calls["CompleteMultipartUpload"] == 1

    data, read_token = mailbox.get_versioned("fragments/0000/versions/0000000001/params-a.safetensors")
    assert read_token == token
    assert counter.ranged_gets == parts
    assert data == payload


def test_multipart_create_once_and_swap_are_conditional(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    session = _session(s3_server)
    counter = CallCounter(session.events)
    mailbox = make_s3_mailbox(session=session, tuning=SMALL_PARTS)
    first, second = _random_bytes(1, 12 * MiB), _random_bytes(2, 11 * MiB)

    token = mailbox.create("blob", first)
    with pytest.raises(RecordExists):
        mailbox.create("blob", second)
    assert mailbox.get_versioned("blob") == (first, token)
    with pytest.raises(VersionConflict):
        mailbox.swap("blob", second, '"stale"')
    new_token = mailbox.swap("blob", second, token)
    assert mailbox.get_versioned("blob") == (second, new_token)
    assert counter.calls["CompleteMultipartUpload"] == 4
    assert counter.calls.get("AbortMultipartUpload", 0) == 2  # the refused uploads leave no parts


# -- max_bytes: refused from the first answer's headers ------------------------------


def test_max_bytes_across_multipart_ranges(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    """INV-13: above one part, an allowed object still comes in parallel ranges with one
    ETag; a refused one costs only the first request, and none of its body is read."""
    session = _session(s3_server)
    log = GetObjectWire(session.events)
    mailbox = make_s3_mailbox(session=session, tuning=SMALL_PARTS)
    payload = _random_bytes(5, 12 * MiB)
    token = mailbox.put("blob", payload)

    assert mailbox.get_versioned("blob", max_bytes=12 * MiB) == (payload, token)
    assert len(log.ranges) == 3 and log.ranges[0] == f"bytes=0-{5 * MiB - 1}"

    for allowance in (12 * MiB - 1, 7 * MiB, 5 * MiB - 1, 10):
        log.ranges.clear()
        log.body_bytes = 0
        with pytest.raises(ObjectTooLarge, match=f"{12 * MiB} bytes, more than the {allowance} bytes"):
            mailbox.get_versioned("blob", max_bytes=allowance)
        assert log.ranges == [f"bytes=0-{min(5 * MiB, allowance + 1) - 1}"]
        assert log.body_bytes == 0


def test_a_store_ignoring_the_range_is_refused_by_content_length(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server
) -> None:
    """INV-13: a store that answers a ranged GET with the whole object is refused by its
    Content-Length header before any of the body is read."""
    session = _session(s3_server)

    def strip_range(request: Any, **_: Any) -> None:
        if "Range" in request.headers:
            del request.headers["Range"]

    session.events.register("before-sign.s3.GetObject", strip_range)
    log = GetObjectWire(session.events)
    mailbox = make_s3_mailbox(session=session)
    payload = _random_bytes(6, 4 * MiB)
    token = mailbox.put("blob", payload)

    with pytest.raises(ObjectTooLarge, match=f"{4 * MiB} bytes"):
        mailbox.get("blob", max_bytes=1000)
    assert log.ranges == [None] and log.body_bytes == 0
    assert mailbox.get_versioned("blob", max_bytes=4 * MiB) == (payload, token)


def test_an_empty_object_replaced_by_a_huge_one_is_still_refused(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server
) -> None:
    """INV-13: an empty object has no byte 0, so its ranged GET fails and is asked again
    whole; a writer who swaps in a huge object between the two requests gains nothing."""
    session = _session(s3_server)
    log = GetObjectWire(session.events)
    huge = _random_bytes(7, 4 * MiB)

    def swap_in_huge(params: dict[str, Any], **_: Any) -> None:
        if "Range" not in params:
            rival.put("blob", huge)

    session.events.register("provide-client-params.s3.GetObject", swap_in_huge)  # before the client exists
    mailbox = make_s3_mailbox(session=session)
    rival = make_s3_mailbox(mailbox.prefix)
    mailbox.put("blob", b"")
    with pytest.raises(ObjectTooLarge, match=f"{4 * MiB} bytes"):
        mailbox.get("blob", max_bytes=1000)
    assert log.ranges == ["bytes=0-1000", None]  # the unranged retry did happen
    assert log.body_bytes == 0


# -- injected transient failures -----------------------------------------------------


def _faulty_mailbox(make: Callable[..., S3Mailbox], server: S3Server, injector: FaultInjector, **options: Any) -> S3Mailbox:
    session = _session(server)
    injector.install(session.events)
    return make(session=session, **options)


def _workload(mailbox: S3Mailbox) -> None:
    token = mailbox.put("a", b"alpha")
    assert mailbox.get("a") == b"alpha"
    assert mailbox.head("a").token == token  # type: ignore[union-attr]
    mailbox.put("b", b"beta")
    assert mailbox.list() == ["a", "b"]
    mailbox.delete("a")
    assert mailbox.list() == ["b"]


@pytest.mark.slow
def test_transient_failures_are_retried_and_replayable(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    operations = frozenset({"PutObject", "GetObject", "HeadObject", "ListObjectsV2", "DeleteObject"})
    runs = []
    for _ in range(2):
        injector = FaultInjector(seed=7, operations=operations, probability=0.4, max_faults=4)
        _workload(_faulty_mailbox(make_s3_mailbox, s3_server, injector))
        runs.append(injector.fired)
    assert runs[0], "the seed must inject at least one fault"
    assert runs[0] == runs[1]  # same seed, same requests failed


def test_transient_failures_in_parallel_transfers_are_retried(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server
) -> None:
    injector = FaultInjector(
        seed=11, operations=frozenset({"UploadPart", "CompleteMultipartUpload", "GetObject"}), probability=0.3
    )
    mailbox = _faulty_mailbox(make_s3_mailbox, s3_server, injector, tuning=SMALL_PARTS)
    payload = _random_bytes(5, 23 * MiB)
    mailbox.create("blob", payload)
    assert mailbox.get("blob") == payload
    assert injector.fired


def test_persistent_failure_becomes_mailbox_unavailable(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    injector = FaultInjector(seed=1, operations=frozenset({"GetObject"}), probability=1.0, max_faults=100)
    mailbox = _faulty_mailbox(make_s3_mailbox, s3_server, injector, tuning=S3Tuning(max_attempts=3))
    mailbox.put("k", b"v")
    with pytest.raises(MailboxUnavailable) as caught:
        mailbox.get("k")
    assert len(injector.fired) == 3
    _assert_clear(caught.value, s3_server.bucket, s3_server.endpoint_url)
    assert caught.value.retryable


# -- lost responses ------------------------------------------------------------------


@pytest.mark.parametrize("size, operation", [(100, "PutObject"), (11 * MiB, "CompleteMultipartUpload")])
def test_a_lost_create_response_is_recognised_as_our_success(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server, size: int, operation: str
) -> None:
    session = _session(s3_server)
    lose = LoseRequests(operation).install(session.events)
    mailbox = make_s3_mailbox(session=session, tuning=SMALL_PARTS)
    mailbox.create("warm-up", b"")  # the conditional-write check passes undisturbed
    lose.arm()
    payload = _random_bytes(size, size)

    token = mailbox.create("rounds/0001.json", payload)

    assert lose.delivered_statuses == [200]  # the first attempt did land
    assert mailbox.get_versioned("rounds/0001.json") == (payload, token)


def test_a_lost_swap_response_is_recognised_as_our_success(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server
) -> None:
    session = _session(s3_server)
    lose = LoseRequests("PutObject").install(session.events)
    mailbox = make_s3_mailbox(session=session)
    token = mailbox.create("lease", b"n=1")
    lose.arm()
    new_token = mailbox.swap("lease", b"n=2", token)
    assert lose.delivered_statuses == [200]
    assert mailbox.get_versioned("lease") == (b"n=2", new_token)


def test_a_rival_object_still_yields_record_exists(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    """Our first attempt never arrives; a rival creates the key before our retry, whose
    412 must then be reported as the lost race it is."""
    session = _session(s3_server)
    mailbox_holder: list[S3Mailbox] = []
    rival_holder: list[S3Mailbox] = []
    lose = LoseRequests(
        "PutObject", deliver=False, meanwhile=lambda: rival_holder[0].create("rounds/0001.json", b"rival")
    ).install(session.events)
    mailbox_holder.append(make_s3_mailbox(session=session))
    rival_holder.append(make_s3_mailbox(mailbox_holder[0].prefix))
    mailbox = mailbox_holder[0]
    mailbox.create("warm-up", b"")
    lose.arm()

    with pytest.raises(RecordExists):
        mailbox.create("rounds/0001.json", b"ours")
    assert lose.dropped == 1
    assert mailbox.get("rounds/0001.json") == b"rival"


# -- errors users cause --------------------------------------------------------------


def _assert_clear(error: BaseException, *names: str) -> None:
    """Our type, one line, naming what the user must look at."""
    assert isinstance(error, GradientMailError)
    assert type(error).__module__ == "gradientmail.errors"
    message = str(error)
    assert "\n" not in message
    for name in names:
        assert name in message, (name, message)


def _every_call(mailbox: S3Mailbox) -> dict[str, Callable[[], object]]:
    return {
        "get": lambda: mailbox.get("k"),
        "get_versioned": lambda: mailbox.get_versioned("k"),
        "head": lambda: mailbox.head("k"),
        "exists": lambda: mailbox.exists("k"),
        "put": lambda: mailbox.put("k", b"v"),
        "create": lambda: mailbox.create("k", b"v"),
        "swap": lambda: mailbox.swap("k", b"v", '"t"'),
        "list": lambda: mailbox.list(),
        "delete": lambda: mailbox.delete("k"),
        "close": lambda: mailbox.close(),
    }


def _errors_of_every_call(mailbox: S3Mailbox) -> dict[str, BaseException | None]:
    errors: dict[str, BaseException | None] = {}
    for name, call in _every_call(mailbox).items():
        try:
            call()
            errors[name] = None
        except BaseException as exc:  # the test inspects every type
            errors[name] = exc
    for name, error in errors.items():
        assert error is None or isinstance(error, GradientMailError), (
            f"{name} leaked {type(error).__module__}.{type(error).__name__}: {error}"
        )
    return errors


def test_missing_bucket(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    mailbox = make_s3_mailbox(bucket="gradientmail-no-such-bucket")
    errors = _errors_of_every_call(mailbox)
    for name in ("get", "get_versioned", "head", "exists", "put", "create", "swap", "list", "delete"):
        error = errors[name]
        assert isinstance(error, MailboxMisconfigured), (name, error)
        _assert_clear(error, "gradientmail-no-such-bucket", "does not exist", s3_server.endpoint_url)


def test_bad_credentials(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    mailbox = make_s3_mailbox(secret_access_key="not-the-secret")
    errors = _errors_of_every_call(mailbox)
    for name in ("get", "get_versioned", "head", "exists", "put", "create", "swap", "list", "delete"):
        error = errors[name]
        assert isinstance(error, MailboxMisconfigured), (name, error)
        _assert_clear(error, s3_server.bucket, s3_server.endpoint_url, "credentials")


def test_unknown_access_key(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    mailbox = make_s3_mailbox(access_key_id="nobody", secret_access_key="nothing")
    with pytest.raises(MailboxMisconfigured) as caught:
        mailbox.put("k", b"v")
    _assert_clear(caught.value, s3_server.bucket, "credentials")


def test_unreachable_endpoint(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{closed_port}"
    mailbox = make_s3_mailbox(endpoint_url=endpoint, tuning=S3Tuning(max_attempts=2, connect_timeout_s=0.5))
    errors = _errors_of_every_call(mailbox)
    for name in ("get", "get_versioned", "head", "exists", "put", "create", "swap", "list", "delete"):
        error = errors[name]
        assert isinstance(error, MailboxUnavailable), (name, error)
        _assert_clear(error, endpoint, s3_server.bucket, "cannot reach")


def test_no_credentials_anywhere(
    make_s3_mailbox: Callable[..., S3Mailbox], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    mailbox = make_s3_mailbox(access_key_id=None, secret_access_key=None)
    with pytest.raises(MailboxMisconfigured) as caught:
        mailbox.get("k")
    _assert_clear(caught.value, "credentials")


def test_unknown_profile(make_s3_mailbox: Callable[..., S3Mailbox], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    mailbox = make_s3_mailbox(access_key_id=None, secret_access_key=None, profile="gradientmail-nope")
    with pytest.raises(MailboxMisconfigured) as caught:
        mailbox.list()
    _assert_clear(caught.value, "gradientmail-nope")


def test_a_store_ignoring_conditional_writes_is_refused(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    """INV-1: a store that ignores conditional writes could commit a version twice, so it is refused.

    Strip the condition headers before signing, as a store that ignores them would:
    the first create-once must refuse to run rather than silently overwrite."""
    session = _session(s3_server)

    def strip_conditions(request: Any, **_: Any) -> None:
        for header in ("If-None-Match", "If-Match"):
            if header in request.headers:
                del request.headers[header]

    session.events.register("before-sign.s3.PutObject", strip_conditions)
    mailbox = make_s3_mailbox(session=session)
    with pytest.raises(MailboxMisconfigured) as caught:
        mailbox.create("rounds/0001.json", b"v")
    _assert_clear(caught.value, "If-None-Match", "If-Match", s3_server.bucket, s3_server.endpoint_url)
    assert not mailbox.exists("rounds/0001.json")
    assert mailbox.list() == []  # the scratch key of the check is gone


def test_bad_arguments_fail_at_construction() -> None:
    with pytest.raises(InvalidConfig, match="bucket"):
        S3Mailbox("")
    with pytest.raises(InvalidConfig, match="prefix"):
        S3Mailbox("b", "runs/../x")
    with pytest.raises(InvalidConfig, match="access_key_id"):
        S3Mailbox("b", access_key_id="only-one")
    with pytest.raises(InvalidConfig, match="endpoint_url"):
        S3Mailbox("b", endpoint_url="127.0.0.1:9000")
    with pytest.raises(InvalidConfig, match="part_size_bytes"):
        S3Tuning(part_size_bytes=1024)
    with pytest.raises(InvalidConfig, match="max_attempts"):
        S3Tuning(max_attempts=0)


# -- URLs, prefixes, MinIO -----------------------------------------------------------


def test_url_with_standard_credentials(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    mailbox = make_s3_mailbox()
    mailbox.put("shared", b"seen by both")
    assert s3_server.secret_key not in mailbox.url
    other = open_mailbox(mailbox.url)
    try:
        assert isinstance(other, S3Mailbox)
        assert other.get("shared") == b"seen by both"
        assert other.url == mailbox.url
    finally:
        other.close()


def test_endpoint_from_the_environment(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    mailbox = open_mailbox(f"s3://{s3_server.bucket}/tests/{uuid.uuid4().hex}?region=us-east-1&addressing=path")
    try:
        mailbox.put("k", b"v")
        assert mailbox.get("k") == b"v"
    finally:
        mailbox.close()


def test_prefix_is_the_run_root(make_s3_mailbox: Callable[..., S3Mailbox], seaweedfs: Any, s3_server: S3Server) -> None:
    root = f"tests/{uuid.uuid4().hex}"
    run = make_s3_mailbox(f"{root}/run")
    sibling = make_s3_mailbox(f"{root}/run-2")
    run.put("manifest.json", b"run")
    sibling.put("manifest.json", b"sibling")
    assert run.list() == ["manifest.json"]
    client = seaweedfs.client()
    stored = [entry["Key"] for entry in client.list_objects_v2(Bucket=s3_server.bucket, Prefix=root)["Contents"]]
    assert sorted(stored) == [f"{root}/run-2/manifest.json", f"{root}/run/manifest.json"]
    # objects under the prefix whose names are not keys are not listed
    client.put_object(Bucket=s3_server.bucket, Key=f"{root}/run/not a key", Body=b"")
    assert run.list() == ["manifest.json"]


def test_minio_mailbox_is_an_s3_mailbox(s3_server: S3Server) -> None:
    host = s3_server.endpoint_url.removeprefix("http://")
    prefix = f"tests/{uuid.uuid4().hex}"
    mailbox = MinioMailbox(host, s3_server.access_key, s3_server.secret_key, s3_server.bucket, prefix, secure=False)
    try:
        assert isinstance(mailbox, S3Mailbox)
        token = mailbox.create("k", b"v")
        assert mailbox.get_versioned("k") == (b"v", token)
        assert mailbox.get_versioned("k", max_bytes=1) == (b"v", token)
        with pytest.raises(ObjectTooLarge):
            mailbox.get("k", max_bytes=0)
        assert mailbox.url == f"minio://{host}/{s3_server.bucket}/{prefix}?secure=false"
        with pytest.MonkeyPatch.context() as env:  # keys come from the environment, never the URL
            env.setenv("MINIO_ACCESS_KEY", s3_server.access_key)
            env.setenv("MINIO_SECRET_KEY", s3_server.secret_key)
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"):
                env.delenv(name, raising=False)
            other = open_mailbox(f"minio://{host}/{s3_server.bucket}/{prefix}?secure=false")
        assert isinstance(other, MinioMailbox)
        assert other.get("k") == b"v"
        assert s3_server.secret_key not in other.url
        other.close()
    finally:
        mailbox.close()


def test_boto3_is_imported_only_when_s3_is_used() -> None:
    code = (
        "import sys; import gradientmail.mailbox as m; "
        "box = m.S3Mailbox('bucket', 'runs/x', endpoint_url='http://127.0.0.1:1'); "
        "assert box.url.startswith('s3://bucket/runs/x'); "
        "leaked = [name for name in ('boto3', 'botocore') if name in sys.modules]; "
        "assert not leaked, leaked"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_keys_mapping_and_missing_keys(make_s3_mailbox: Callable[..., S3Mailbox]) -> None:
    mailbox = make_s3_mailbox()
    with pytest.raises(KeyNotFound, match="missing"):
        mailbox.get("missing")
    assert mailbox.head("missing") is None


# -- one hash per byte -------------------------------------------------------------------


class _DamageOnePutBody:
    """Flips one byte of the next PutObject body after it is signed, as a bad link would: the
    request goes to the real server with the headers it was signed with."""

    def __init__(self, events: Any) -> None:
        self.damaged = 0
        events.register("before-send.s3.PutObject", self._before_send)

    def _before_send(self, request: Any, **_: Any) -> None:
        body = request.body
        data = body.getvalue() if isinstance(body, io.BytesIO) else body
        if self.damaged == 0 and isinstance(data, bytes) and len(data) > 1000:
            self.damaged += 1
            request.body = io.BytesIO(data[:500] + bytes([data[500] ^ 0xFF]) + data[501:])


def test_a_blob_write_hashes_once_and_the_server_refuses_a_damaged_body(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server
) -> None:
    """put_hashed returns the payload's sha256 and sends it as the object's checksum: a body
    damaged after signing is refused (BadDigest), nothing is stored, and the next try stores
    the right bytes. botocore hashes no body itself (no CRC32, no payload signing sha256)."""
    session = _session(s3_server)
    damage = _DamageOnePutBody(session.events)
    hashed: list[int] = []
    import botocore.auth as auth
    import botocore.httpchecksum as httpchecksum

    mailbox = make_s3_mailbox(session=session)
    payload = _random_bytes(7, 2 * MiB)
    with pytest.raises(GradientMailError):
        mailbox.put_hashed("blobs/one", payload, "sha256")
    assert damage.damaged == 1 and mailbox.head("blobs/one") is None
    original_payload, original_crc = auth.S3SigV4Auth.payload, httpchecksum.Crc32Checksum.update
    signed: list[str] = []

    def payload_hash(self: Any, request: Any) -> str:
        signed.append(original_payload(self, request))
        return signed[-1]

    def crc(self: Any, chunk: bytes) -> None:
        hashed.append(len(chunk))
        original_crc(self, chunk)

    auth.S3SigV4Auth.payload = payload_hash  # type: ignore[method-assign]
    httpchecksum.Crc32Checksum.update = crc  # type: ignore[method-assign]
    try:
        token, digest = mailbox.put_hashed("blobs/one", payload, "sha256")
        data, read_digest = mailbox.get_hashed("blobs/one", "sha256")
    finally:
        auth.S3SigV4Auth.payload, httpchecksum.Crc32Checksum.update = original_payload, original_crc  # type: ignore[method-assign]
    assert digest == read_digest == hashlib.sha256(payload).hexdigest() and data == payload
    assert token == mailbox.head("blobs/one").token  # type: ignore[union-attr]
    assert signed and set(signed) <= {auth.UNSIGNED_PAYLOAD, auth.EMPTY_SHA256_HASH}, "botocore hashed a body to sign it"
    assert not hashed, "botocore took a CRC32 of a body"
    # a create-once record is checked by the server as well: a damaged one is never stored
    damage.damaged = 0
    with pytest.raises(GradientMailError):
        mailbox.create("records/one.json", b"{" + b" " * 2000 + b"}")
    assert damage.damaged == 1 and mailbox.head("records/one.json") is None


def test_a_blake3_blob_is_sent_without_a_checksum_s3_cannot_check_and_its_reader_refuses_damage(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server
) -> None:
    """S3 knows no BLAKE3: a BLAKE3 run's single PutObject carries no content checksum (as every
    multipart part), so a body damaged on the way is stored, and the reader's check against
    the reference's digest refuses it (``Blobs.read``: CorruptPayload, never the damaged bytes)."""
    session = _session(s3_server)
    damage = _DamageOnePutBody(session.events)
    sent: list[dict[str, Any]] = []
    session.events.register("provide-client-params.s3.PutObject", lambda params, **_: sent.append(dict(params)))
    mailbox = make_s3_mailbox(session=session)
    payload = _random_bytes(8, 2 * MiB)
    token, digest = mailbox.put_hashed("blobs/one", payload, "blake3")
    assert damage.damaged == 1 and digest == blake3.blake3(payload).hexdigest()
    assert not any(name.startswith("Checksum") for name in sent[-1]), sent[-1].keys()
    blobs = Blobs(mailbox, "blake3")
    with pytest.raises(CorruptPayload, match="checksum mismatch"):
        blobs.read(PayloadRef.pinned("blobs/one", "blake3", digest, len(payload)))
    good = blobs.put("blobs/two", payload)
    assert good.blake3 == digest and good.sha256 is None and blobs.read(good) == payload
