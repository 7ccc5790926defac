"""open_mailbox: every scheme, round trips of .url, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

import gradientmail.mailbox as mailbox_package
from gradientmail.errors import InvalidConfig
from gradientmail.mailbox import FileMailbox, MemoryMailbox, MinioMailbox, S3Mailbox, S3Tuning, open_mailbox


def test_exported_names_stay_as_documented() -> None:
    assert sorted(mailbox_package.__all__) == sorted(
        [
            "Mailbox",
            "ObjectInfo",
            "ForwardingMailbox",
            "Gathered",
            "MeteredMailbox",
            "RequestCounts",
            "MemoryMailbox",
            "FileMailbox",
            "S3Mailbox",
            "S3Tuning",
            "MinioMailbox",
            "open_mailbox",
            "validate_key",
        ]
    )


def test_memory_urls_share_state_by_name() -> None:
    one = open_mailbox("memory://url-test-shared")
    two = open_mailbox("memory://url-test-shared")
    one.put("k", b"v")
    assert two.get("k") == b"v"
    assert one.url == "memory://url-test-shared"
    assert open_mailbox("memory://url-test-other").list() == []


def test_an_unnamed_memory_mailbox_is_reachable_by_its_url_while_held() -> None:
    private = MemoryMailbox()
    private.put("k", b"v")
    assert open_mailbox(private.url).get("k") == b"v"
    assert open_mailbox("memory://").list() == []  # a fresh one each time


def test_file_url_round_trip(tmp_path: Path) -> None:
    directory = tmp_path / "with space"
    mailbox = FileMailbox(directory)
    assert mailbox.url.startswith("file:///") and " " not in mailbox.url
    reopened = open_mailbox(mailbox.url)
    assert isinstance(reopened, FileMailbox) and reopened.path == directory


def test_s3_url_parameters() -> None:
    mailbox = open_mailbox(
        "s3://my-training/runs/example?endpoint=http%3A%2F%2F127.0.0.1%3A9000&region=eu-west-1"
        "&profile=lab&addressing=path&max_attempts=7&part_size_bytes=8388608&verify_conditional_writes=false"
    )
    assert isinstance(mailbox, S3Mailbox) and not isinstance(mailbox, MinioMailbox)
    assert (mailbox.bucket, mailbox.prefix) == ("my-training", "runs/example")
    assert mailbox.url == (
        "s3://my-training/runs/example?endpoint=http%3A%2F%2F127.0.0.1%3A9000&region=eu-west-1&profile=lab&addressing=path"
    )
    assert open_mailbox(mailbox.url).url == mailbox.url
    assert open_mailbox("s3://bucket").url == "s3://bucket/"


def test_s3_mailbox_url_from_constructor() -> None:
    mailbox = S3Mailbox("my-training", "runs/example", tuning=S3Tuning())
    assert mailbox.url == "s3://my-training/runs/example"


def test_minio_url() -> None:
    mailbox = open_mailbox("minio://minio.local:9000/bucket/runs/a?secure=false")
    assert isinstance(mailbox, MinioMailbox)
    assert mailbox.url == "minio://minio.local:9000/bucket/runs/a?secure=false"
    assert mailbox.endpoint == "http://minio.local:9000"
    assert open_mailbox("minio://minio.local:9000/bucket").url == "minio://minio.local:9000/bucket/"


@pytest.mark.parametrize(
    "url, words",
    [
        ("ftp://host/x", "no known scheme"),
        ("/plain/path", "no known scheme"),
        ("s3://", "names no bucket"),
        ("s3://key:secret@bucket/x", "no credentials"),
        ("s3://bucket/x?colour=blue", "unknown parameter"),
        ("s3://bucket/x?max_attempts=many", "not a valid int"),
        ("s3://bucket/x?max_attempts=0", "max_attempts"),
        ("s3://bucket/x?region=a&region=b", "given twice"),
        ("s3://bucket/../x", "prefix"),
        ("file://host/x", "local path"),
        ("file:relative/x", "absolute"),
        ("file:///x?fsync=maybe", "not true or false"),
        ("memory://a/b", "memory://name"),
        ("memory://bad name", "memory name"),
        ("minio://host:9000", "names no bucket"),
        ("minio://user:hunter2@:9000/b", "no credentials in the URL"),
        ("minio://user:hunter2@minio.local:9000/b/runs/a", "MINIO_ACCESS_KEY/MINIO_SECRET_KEY"),
        ("minio://user@minio.local:9000/b", "AWS_ACCESS_KEY_ID"),
        ("s3://key:hunter2@bucket/x", "AWS_ACCESS_KEY_ID"),
        ("minio://:9000/b", "names no host"),
        ("s3://bucket/x#frag", "fragment"),
    ],
)
def test_bad_urls_are_invalid_config(url: str, words: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        open_mailbox(url)
    assert words in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_minio_mailbox_takes_credentials_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.setenv("MINIO_ACCESS_KEY", "scoped-user")
    monkeypatch.setenv("MINIO_SECRET_KEY", "hunter2")
    mailbox = open_mailbox("minio://minio.local:9000/bucket/runs/a?secure=false")
    assert isinstance(mailbox, MinioMailbox)
    assert mailbox._credentials[:2] == ("scoped-user", "hunter2")
    assert "hunter2" not in mailbox.url
    explicit = MinioMailbox("minio.local:9000", "given", "given-secret", "bucket", secure=False)
    assert explicit._credentials[:2] == ("given", "given-secret")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "aws-user")  # boto3's chain (AWS_*) comes first
    assert open_mailbox("minio://minio.local:9000/bucket")._credentials[:2] == (None, None)  # type: ignore[attr-defined]
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("MINIO_SECRET_KEY")
    with pytest.raises(InvalidConfig, match="MINIO_SECRET_KEY"):
        open_mailbox("minio://minio.local:9000/bucket")
