"""Directory store specifics: atomic files, what list hides, key clashes, error translation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gradientmail.errors import InvalidKey, MailboxMisconfigured, RecordExists
from gradientmail.mailbox import FileMailbox, open_mailbox


def _all_files(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


def test_files_mirror_keys_and_no_temp_files_remain(tmp_path: Path) -> None:
    mailbox = FileMailbox(tmp_path)
    mailbox.put("a/b.json", b"1")
    mailbox.create("a/c.json", b"2")
    token = mailbox.put("d", b"3")
    mailbox.swap("d", b"4", token)
    with pytest.raises(RecordExists):
        mailbox.create("a/c.json", b"again")
    files = [name for name in _all_files(tmp_path) if not name.startswith("~locks")]
    assert files == ["a/b.json", "a/c.json", "d"]
    assert (tmp_path / "a" / "c.json").read_bytes() == b"2"


def test_list_hides_temp_lock_and_foreign_files(tmp_path: Path) -> None:
    mailbox = FileMailbox(tmp_path)
    mailbox.put("runs/k", b"v")
    # a writer that crashed mid-put, lock stripes, and files that are not keys
    (tmp_path / "runs" / "k.~tmp.0123").write_bytes(b"partial")
    (tmp_path / "runs" / "not a key").write_bytes(b"")
    (tmp_path / "~other").mkdir()
    (tmp_path / "~other" / "x").write_bytes(b"")
    os.symlink(tmp_path / "runs" / "k", tmp_path / "runs" / "link")
    assert any((tmp_path / "~locks").iterdir())
    assert mailbox.list() == ["runs/k"]


def test_a_key_cannot_also_be_a_directory(tmp_path: Path) -> None:
    mailbox = FileMailbox(tmp_path)
    mailbox.put("a/b", b"v")
    with pytest.raises(InvalidKey, match="clashes"):
        mailbox.put("a", b"v")
    with pytest.raises(InvalidKey, match="clashes"):
        mailbox.create("a", b"v")
    with pytest.raises(InvalidKey, match="clashes"):
        mailbox.put("a/b/c", b"v")
    assert not mailbox.exists("a")
    assert mailbox.head("a") is None
    assert mailbox.list() == ["a/b"]


def test_tokens_come_from_content_not_from_the_file(tmp_path: Path) -> None:
    mailbox = FileMailbox(tmp_path)
    first = mailbox.put("k", b"same bytes")
    assert mailbox.put("k", b"same bytes") == first  # identical bytes, identical token (like an ETag)
    other = mailbox.put("k", b"same byteZ")  # same size, likely same mtime and a recycled inode
    assert other != first


def test_two_instances_share_one_directory(tmp_path: Path) -> None:
    one, two = FileMailbox(tmp_path), FileMailbox(tmp_path)
    one.create("k", b"first")
    with pytest.raises(RecordExists):
        two.create("k", b"second")
    assert two.get("k") == b"first"


def test_an_unusable_root_is_misconfigured(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(MailboxMisconfigured, match="cannot create the mailbox directory"):
        FileMailbox(tmp_path / "file" / "mailbox")


def test_no_oserror_escapes_when_the_directory_vanishes(tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "mailbox"
    mailbox = FileMailbox(root)
    mailbox.put("k", b"v")
    shutil.rmtree(root)
    (tmp_path / "mailbox").write_bytes(b"now a file")
    for call in (
        lambda: mailbox.put("k", b"v"),
        lambda: mailbox.create("k", b"v"),
        lambda: mailbox.swap("k", b"v", "t"),
        lambda: mailbox.get("k"),
        lambda: mailbox.delete("k"),
        lambda: mailbox.list(),
        lambda: mailbox.head("k"),
        lambda: mailbox.exists("k"),
    ):
        try:
            call()
        except Exception as exc:  # the test inspects the type
            assert type(exc).__module__ == "gradientmail.errors", repr(exc)


def test_fsync_can_be_turned_off_by_url(tmp_path: Path) -> None:
    mailbox = open_mailbox(f"file://{tmp_path}?fsync=false")
    assert isinstance(mailbox, FileMailbox)
    mailbox.put("k", b"v")
    assert mailbox.get("k") == b"v"
