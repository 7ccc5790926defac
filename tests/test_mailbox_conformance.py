"""The mailbox contract, written once and run against every store (memory, file, s3)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import numpy as np
import pytest

from gradientmail.errors import InvalidKey, KeyNotFound, ObjectTooLarge, RecordExists, VersionConflict
from gradientmail.mailbox import FileMailbox, Mailbox, S3Mailbox, open_mailbox
from gradientmail.mailbox.base import StampedGet
from tests.s3_faults import GetObjectWire
from tests.seaweedfs import S3Server

BAD_KEYS = {
    "../x": "'..' segment",
    "/abs": "starts with '/'",
    "a//b": "empty segment",
    "a\\b": "backslash",
    "a b": "characters outside",
    "": "empty",
    ".": "'.' segment",
    "a/./b": "'.' segment",
    "a/": "ends with '/'",
    "x" * 600: "characters long",
    "é": "characters outside",
}


def test_satisfies_the_protocol(mailbox: Mailbox) -> None:
    assert isinstance(mailbox, Mailbox)


def test_put_get_round_trip(mailbox: Mailbox) -> None:
    token = mailbox.put("a/b.bin", b"\x00payload\xff")
    assert isinstance(token, str) and token
    assert mailbox.get("a/b.bin") == b"\x00payload\xff"
    assert mailbox.get_versioned("a/b.bin") == (b"\x00payload\xff", token)


def test_put_overwrites_and_changes_the_token(mailbox: Mailbox) -> None:
    first = mailbox.put("k", b"one")
    second = mailbox.put("k", b"two")
    assert first != second
    assert mailbox.get("k") == b"two"


def test_empty_payload(mailbox: Mailbox) -> None:
    mailbox.put("empty", b"")
    assert mailbox.get("empty") == b""
    info = mailbox.head("empty")
    assert info is not None and (info.size, info.token) == (0, mailbox.get_versioned("empty")[1])


def test_bytearray_and_memoryview_payloads_are_stored_as_bytes(mailbox: Mailbox) -> None:
    buffer = bytearray(b"mutable")
    mailbox.put("ba", buffer)  # type: ignore[arg-type]
    buffer[:] = b"changed"
    mailbox.put("mv", memoryview(b"view"))  # type: ignore[arg-type]
    assert mailbox.get("ba") == b"mutable"
    assert mailbox.get("mv") == b"view"


def test_str_payload_is_refused(mailbox: Mailbox) -> None:
    with pytest.raises(TypeError):
        mailbox.put("k", "text")  # type: ignore[arg-type]
    assert not mailbox.exists("k")


def test_missing_key(mailbox: Mailbox) -> None:
    with pytest.raises(KeyNotFound, match="nope"):
        mailbox.get("nope")
    with pytest.raises(KeyNotFound):
        mailbox.get_versioned("nope")
    assert mailbox.head("nope") is None
    assert mailbox.exists("nope") is False


def test_head_and_exists(mailbox: Mailbox) -> None:
    token = mailbox.put("dir/obj", b"12345")
    info = mailbox.head("dir/obj")
    assert info is not None and (info.size, info.token) == (5, token)
    assert mailbox.exists("dir/obj")
    assert not mailbox.exists("dir")  # a key's parent is not itself a key
    assert mailbox.head("dir") is None
    with pytest.raises(KeyNotFound):
        mailbox.get("dir")


def test_head_says_when_the_store_stamped_each_write(mailbox: Mailbox) -> None:
    """Every store stamps writes with its clock (here the machine's own, the loopback server's
    too), truncated to the resolution it states: what barriers share as a clock."""
    for write in ("put", "create", "swap"):
        key = f"stamped/{write}"
        token = mailbox.put(key, b"old") if write == "swap" else None
        before = time.time()
        if write == "swap":
            assert token is not None
            mailbox.swap(key, b"new", token)
        else:
            getattr(mailbox, write)(key, b"new")
        after = time.time()
        info = mailbox.head(key)
        assert info is not None and info.modified_at is not None
        assert before - info.modified_resolution_s - 0.002 <= info.modified_at <= after + 0.002, (before, info, after)
    assert mailbox.head("stamped/none") is None


def test_a_stamped_read_says_what_head_says_of_the_same_bytes(mailbox: Mailbox) -> None:
    """``StampedGet`` (every store here has it): the bytes, and size, token and stamp of exactly
    those bytes from the same answer, as a HEAD reports them; the same errors as ``get_versioned``."""
    assert isinstance(mailbox, StampedGet)
    token = mailbox.put("stamped/read", b"lease bytes")
    data, info = mailbox.get_stamped("stamped/read", max_bytes=64)
    head = mailbox.head("stamped/read")
    assert data == b"lease bytes" and head is not None
    assert (info.size, info.token, info.modified_at, info.modified_resolution_s) == (
        head.size,
        token,
        head.modified_at,
        head.modified_resolution_s,
    )
    with pytest.raises(ObjectTooLarge):
        mailbox.get_stamped("stamped/read", max_bytes=4)
    with pytest.raises(KeyNotFound):
        mailbox.get_stamped("stamped/missing")


def test_delete_is_idempotent(mailbox: Mailbox) -> None:
    mailbox.put("gone", b"x")
    mailbox.delete("gone")
    mailbox.delete("gone")
    mailbox.delete("never-existed")
    assert not mailbox.exists("gone")
    with pytest.raises(KeyNotFound):
        mailbox.get("gone")


def test_list_is_sorted_and_filtered_by_string_prefix(mailbox: Mailbox) -> None:
    keys = ["b/2", "a/1.x", "a/10/x", "ab", "a/1/deep/er", "c"]
    for key in keys:
        mailbox.put(key, key.encode())
    assert mailbox.list() == sorted(keys)
    assert mailbox.list("a/") == ["a/1.x", "a/1/deep/er", "a/10/x"]
    assert mailbox.list("a/1") == ["a/1.x", "a/1/deep/er", "a/10/x"]
    assert mailbox.list("a/1/") == ["a/1/deep/er"]
    assert mailbox.list("a") == ["a/1.x", "a/1/deep/er", "a/10/x", "ab"]
    assert mailbox.list("a/1/deep/er") == ["a/1/deep/er"]
    assert mailbox.list("zzz") == []
    mailbox.delete("c")
    assert "c" not in mailbox.list()


def test_list_of_a_run_layout(mailbox: Mailbox) -> None:
    mailbox.put("runs/r1/manifest.json", b"m")
    mailbox.put("runs/r1/rounds/0001.json", b"r")
    mailbox.put("runs/r10/manifest.json", b"m")
    assert mailbox.list("runs/r1/") == ["runs/r1/manifest.json", "runs/r1/rounds/0001.json"]
    assert mailbox.list("runs/r1") == [
        "runs/r1/manifest.json",
        "runs/r1/rounds/0001.json",
        "runs/r10/manifest.json",
    ]


def test_create_once(mailbox: Mailbox) -> None:
    """INV-1: a second create-once is refused and the first writer's bytes stay."""
    token = mailbox.create("rounds/0001.json", b"first writer")
    with pytest.raises(RecordExists, match=r"rounds/0001\.json"):
        mailbox.create("rounds/0001.json", b"second writer")
    assert mailbox.get_versioned("rounds/0001.json") == (b"first writer", token)


def test_create_after_delete_succeeds(mailbox: Mailbox) -> None:
    mailbox.create("k", b"one")
    mailbox.delete("k")
    mailbox.create("k", b"two")
    assert mailbox.get("k") == b"two"


def test_swap(mailbox: Mailbox) -> None:
    first = mailbox.put("lease", b"holder=a;n=1")
    second = mailbox.swap("lease", b"holder=a;n=2", first)
    assert second != first
    with pytest.raises(VersionConflict):
        mailbox.swap("lease", b"holder=b;n=1", first)  # stale token
    assert mailbox.get("lease") == b"holder=a;n=2"
    third = mailbox.swap("lease", b"holder=b;n=3", second)
    assert mailbox.get_versioned("lease") == (b"holder=b;n=3", third)


def test_swap_with_a_token_from_get_versioned_and_head(mailbox: Mailbox) -> None:
    mailbox.create("lease", b"v1")
    _, token = mailbox.get_versioned("lease")
    info = mailbox.head("lease")
    assert info is not None and info.token == token
    mailbox.swap("lease", b"v2", token)
    with pytest.raises(VersionConflict):
        mailbox.swap("lease", b"v3", info.token)


def test_swap_on_a_missing_key(mailbox: Mailbox) -> None:
    token = mailbox.put("lease", b"v1")
    mailbox.delete("lease")
    with pytest.raises(KeyNotFound):
        mailbox.swap("lease", b"v2", token)
    assert not mailbox.exists("lease")


def test_swap_with_a_garbage_token(mailbox: Mailbox) -> None:
    mailbox.put("lease", b"v1")
    with pytest.raises(VersionConflict):
        mailbox.swap("lease", b"v2", "not-a-token")
    assert mailbox.get("lease") == b"v1"


@pytest.mark.parametrize("key, problem", BAD_KEYS.items(), ids=list(range(len(BAD_KEYS))))
def test_bad_keys_are_refused_before_any_io(mailbox: Mailbox, key: str, problem: str) -> None:
    """INV-7: every operation refuses a bad key, naming the problem, before any I/O."""
    calls = [
        lambda: mailbox.get(key),
        lambda: mailbox.get_versioned(key),
        lambda: mailbox.head(key),
        lambda: mailbox.exists(key),
        lambda: mailbox.put(key, b"x"),
        lambda: mailbox.create(key, b"x"),
        lambda: mailbox.swap(key, b"x", "token"),
        lambda: mailbox.delete(key),
    ]
    for call in calls:
        with pytest.raises(InvalidKey) as caught:
            call()
        assert problem in str(caught.value)
        assert repr(key)[:40].rstrip("'") in str(caught.value)
    assert mailbox.list() == []


def test_bad_list_prefix_is_refused(mailbox: Mailbox) -> None:
    """INV-7: a path-like list prefix is refused."""
    for prefix in ["../", "/abs", "a//", "a b"]:
        with pytest.raises(InvalidKey):
            mailbox.list(prefix)


def test_non_str_key_is_refused(mailbox: Mailbox) -> None:
    """INV-7: a key that is not a str is refused."""
    with pytest.raises(InvalidKey, match="must be a str"):
        mailbox.get(b"bytes-key")  # type: ignore[arg-type]


@pytest.mark.slow
def test_list_returns_every_key_past_one_page(mailbox: Mailbox) -> None:
    """More than S3's 1,000-key page: all come back, so listing follows every page."""
    keys = [f"many/{index:05d}" for index in range(1100)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: mailbox.put(key, b""), keys))
    mailbox.put("other/x", b"")
    assert mailbox.list("many/") == keys
    assert len(mailbox.list()) == 1101


def test_url_reopens_the_same_mailbox(
    mailbox: Mailbox, store: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if store == "s3":  # s3:// URLs carry no secrets: credentials come the standard way
        server = request.getfixturevalue("s3_server")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    mailbox.put("shared", b"seen by both")
    other = open_mailbox(mailbox.url)
    try:
        assert other.url == mailbox.url
        assert other.get("shared") == b"seen by both"
        other.put("back", b"and back")
        assert mailbox.get("back") == b"and back"
    finally:
        other.close()


def test_close_is_idempotent_and_the_mailbox_reopens(mailbox: Mailbox) -> None:
    mailbox.put("k", b"v")
    mailbox.close()
    mailbox.close()
    assert mailbox.get("k") == b"v"


# -- max_bytes: the size is checked before the bytes are read ----------------------------


def test_an_object_of_exactly_max_bytes_is_returned(mailbox: Mailbox) -> None:
    payload = os.urandom(1000)
    token = mailbox.put("blob", payload)
    assert mailbox.get("blob", max_bytes=1000) == payload
    assert mailbox.get_versioned("blob", max_bytes=1000) == (payload, token)
    assert mailbox.get_versioned("blob", max_bytes=10**9) == (payload, token)
    assert mailbox.get("blob", max_bytes=np.int64(1000)) == payload  # any integer type
    assert mailbox.get("blob", max_bytes=None) == payload


def test_one_byte_over_max_bytes_raises_object_too_large(mailbox: Mailbox) -> None:
    """INV-13: every store refuses an object one byte over the reader's allowance."""
    mailbox.put("dir/blob", os.urandom(1001))
    for read in (mailbox.get, mailbox.get_versioned):
        with pytest.raises(ObjectTooLarge) as caught:
            read("dir/blob", max_bytes=1000)
        message = str(caught.value)
        assert "'dir/blob'" in message and "1001 bytes" in message and "1000 bytes" in message
        assert "\n" not in message
        assert not caught.value.retryable
    assert mailbox.get("dir/blob", max_bytes=1001) == mailbox.get("dir/blob")  # refusing changed nothing


def test_max_bytes_zero(mailbox: Mailbox) -> None:
    token = mailbox.put("empty", b"")
    assert mailbox.get("empty", max_bytes=0) == b""
    assert mailbox.get_versioned("empty", max_bytes=0) == (b"", token)
    mailbox.put("one", b"x")
    with pytest.raises(ObjectTooLarge, match="'one'"):
        mailbox.get("one", max_bytes=0)
    with pytest.raises(ObjectTooLarge, match="'one'"):
        mailbox.get_versioned("one", max_bytes=0)


def test_max_bytes_on_a_missing_key(mailbox: Mailbox) -> None:
    with pytest.raises(KeyNotFound):
        mailbox.get("nope", max_bytes=10)
    with pytest.raises(KeyNotFound):
        mailbox.get_versioned("nope", max_bytes=0)


@pytest.mark.parametrize(
    "bad, error, problem",
    [(-1, ValueError, ">= 0"), (1.5, TypeError, "float"), ("10", TypeError, "str"), (True, TypeError, "bool")],
    ids=["negative", "float", "str", "bool"],
)
def test_a_malformed_max_bytes_is_refused(mailbox: Mailbox, bad: object, error: type[Exception], problem: str) -> None:
    mailbox.put("k", b"value")
    for read in (mailbox.get, mailbox.get_versioned):
        with pytest.raises(error, match="max_bytes") as caught:
            read("k", max_bytes=bad)  # type: ignore[arg-type]
        assert problem in str(caught.value)
        assert not isinstance(caught.value, ObjectTooLarge)
    with pytest.raises(InvalidKey):  # the key is still checked first
        mailbox.get("../k", max_bytes=bad)  # type: ignore[arg-type]


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_file_store_bounds_the_read_when_fstat_understates_the_size(tmp_path: Path) -> None:
    """INV-13: fstat is not the only guard: a key that is (a link to) an endless file whose
    size reads as 0 is cut off after max_bytes + 1 bytes, not read forever."""
    box = FileMailbox(tmp_path / "mailbox")
    os.symlink("/dev/zero", box.path / "endless")
    with pytest.raises(ObjectTooLarge, match="'endless'.* larger than the 1000 bytes"):
        box.get("endless", max_bytes=1000)
    with pytest.raises(ObjectTooLarge):
        box.get_versioned("endless", max_bytes=0)


@pytest.mark.s3
def test_s3_refuses_a_large_object_after_one_small_ranged_get(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server
) -> None:
    """INV-13: a 4 MB object refused at max_bytes=1000 costs one GetObject for bytes 0-1000:
    the server sends at most 1001 bytes and none of them are read."""
    session = boto3.Session(
        aws_access_key_id=s3_server.access_key, aws_secret_access_key=s3_server.secret_key, region_name=s3_server.region
    )
    wire = GetObjectWire(session.events)
    mailbox = make_s3_mailbox(session=session)
    payload = os.urandom(4_000_000)
    token = mailbox.put("fragments/huge.bin", payload)

    for read in (mailbox.get, mailbox.get_versioned):
        with pytest.raises(ObjectTooLarge, match=r"'fragments/huge\.bin'.* 4000000 bytes.* 1000 bytes"):
            read("fragments/huge.bin", max_bytes=1000)
    assert wire.ranges == ["bytes=0-1000", "bytes=0-1000"]
    assert all(length <= 1001 for length in wire.content_lengths)
    assert sum(wire.content_lengths) + wire.body_bytes < 64 * 1024
    assert wire.body_bytes == 0  # refused from the headers alone

    assert mailbox.get_versioned("fragments/huge.bin", max_bytes=4_000_000) == (payload, token)
