"""A payload written out of its pieces (``Gathered``): the S3 store sends each part straight from
the arrays' buffers, with no joined copy, hashes them once, survives retried parts; the directory
store writes the pieces in chunks and hands its token over as the sha256; every other store (or a
wrapper that overrides ``put``) gets the same bytes joined."""

from __future__ import annotations

import gc
import hashlib
import io
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import blake3
import numpy as np
import pytest

from gradientmail.backends import payload
from gradientmail.digests import DIGESTS, DigestName, hex_digest
from gradientmail.mailbox import FileMailbox, ForwardingMailbox, MemoryMailbox, S3Mailbox, S3Tuning
from gradientmail.mailbox._s3_transfer import PartBody
from gradientmail.mailbox.base import Gathered, HashingGet, HashingPut
from gradientmail.mailbox.directory import WRITE_CHUNK_BYTES
from testing.fault_proxy import FaultProxy
from tests.seaweedfs import S3Server

MiB = 1024 * 1024
SMALL_PARTS = S3Tuning(multipart_threshold_bytes=5 * MiB, part_size_bytes=5 * MiB, max_concurrency=4)


def _pieces(seed: int, sizes: list[int]) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(size) for size in sizes]


def test_between_cuts_the_concatenation_across_pieces_without_copying() -> None:
    pieces = [b"abc", b"", bytearray(b"defg"), memoryview(b"hi")]
    gathered = Gathered(pieces)
    whole = b"abcdefghi"
    assert len(gathered) == len(whole) and gathered.join() == whole
    assert len(gathered.pieces) == 3  # the empty piece is dropped
    for start in range(len(whole) + 1):
        for stop in range(start, len(whole) + 1):
            assert b"".join(gathered.between(start, stop)) == whole[start:stop], (start, stop)
    source = bytearray(b"0123456789")
    (view,) = Gathered([source]).between(2, 5)
    source[3] = ord("x")
    assert bytes(view) == b"2x4"  # a view of the buffer, not a copy
    assert gathered.hexdigest("sha256") == hashlib.sha256(whole).hexdigest()
    assert gathered.hexdigest("blake3") == blake3.blake3(whole).hexdigest()


def test_a_part_body_reads_sizes_and_seeks_as_a_file_and_rewinds_for_a_retry() -> None:
    whole = bytes(range(256)) * 40
    body = PartBody(Gathered([whole[:1000], whole[1000:1001], whole[1001:]]))
    assert len(body) == len(whole) and body.tell() == 0
    chunks = []
    while chunk := body.read(333):
        assert len(chunk) <= 333
        chunks.append(bytes(chunk))
    assert b"".join(chunks) == whole and body.read(10) == b""
    assert body.seek(0) == 0 and bytes(body.read()) == whole  # what botocore's reset_stream does
    body.seek(-5, io.SEEK_END)
    assert bytes(body.read(100)) == whole[-5:]
    body.seek(10)
    body.seek(7, io.SEEK_CUR)
    assert body.tell() == 17 and bytes(body.read(3)) == whole[17:20]


@pytest.mark.s3
@pytest.mark.parametrize(
    "sizes",
    [
        [8, 3 * MiB, 4 * MiB + 5, 7, 6 * MiB - 13],  # parts that straddle pieces
        [32, 12 * MiB],  # one large piece, cut into parts
        [16, 1000, 3 * MiB],  # under the threshold: one PutObject, joined
    ],
)
@pytest.mark.parametrize("digest", DIGESTS)
def test_a_gathered_payload_lands_as_its_concatenation_with_its_digest(
    make_s3_mailbox: Callable[..., S3Mailbox], sizes: list[int], digest: DigestName
) -> None:
    pieces = _pieces(sum(sizes), sizes)
    whole = b"".join(pieces)
    mailbox = make_s3_mailbox(tuning=SMALL_PARTS)
    token, hexdigest = mailbox.put_hashed("blobs/gathered", Gathered(pieces), digest)
    assert hexdigest == hex_digest(digest, whole)
    data, read_token = mailbox.get_versioned("blobs/gathered")
    assert data == whole and read_token == token
    assert mailbox.get_hashed("blobs/gathered", digest) == (whole, hexdigest)


@pytest.mark.s3
def test_a_gathered_upload_holds_no_copy_of_the_payload(make_s3_mailbox: Callable[..., S3Mailbox]) -> None:
    """Joining the pieces, or a bytes slice per part, would allocate about the payload again;
    parts sent out of the pieces allocate a small fraction of it (the HTTP stack's own)."""
    arrays = {f"w{i}": np.random.default_rng(i).standard_normal(1_500_000).astype(np.float32) for i in range(6)}
    size = sum(a.nbytes for a in arrays.values())
    mailbox = make_s3_mailbox(tuning=SMALL_PARTS)
    mailbox.put_hashed("warm", b"x" * (6 * MiB), "sha256")  # the client, its pool and the conditional-write probe
    gc.collect()
    tracemalloc.start()
    try:
        _, digest = mailbox.put_hashed("blobs/fragment", Gathered(payload.encode_pieces(arrays)), "sha256")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    encoded = payload.encode(arrays)
    assert digest == hashlib.sha256(encoded).hexdigest() and mailbox.get("blobs/fragment") == encoded
    assert peak < 0.25 * size, f"peak {peak / MiB:.1f} MiB while uploading {size / MiB:.1f} MiB"


@pytest.mark.s3
def test_parts_refused_or_cut_off_are_sent_again_from_the_pieces(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server
) -> None:
    pieces = _pieces(7, [40, 5 * MiB + 3, 9 * MiB, 11])
    whole = b"".join(pieces)
    with FaultProxy(s3_server.endpoint_url, rate=0.0, seed=5, kinds=("503", "reset_before", "reset_after")) as proxy:
        mailbox = make_s3_mailbox(endpoint_url=proxy.endpoint_url, tuning=SMALL_PARTS)
        mailbox.put("warm", b"w")
        proxy.configure(rate=0.3)
        _, digest = mailbox.put_hashed("blobs/retried", Gathered(pieces), "sha256")
        proxy.configure(rate=0.0)
        assert proxy.counts()["faults"] > 0
        assert digest == hashlib.sha256(whole).hexdigest() and mailbox.get("blobs/retried") == whole


@pytest.mark.parametrize(
    "sizes",
    [
        [8, WRITE_CHUNK_BYTES - 1, 2 * WRITE_CHUNK_BYTES + 5, 7],  # chunks that straddle pieces
        [3 * WRITE_CHUNK_BYTES],  # whole chunks only
        [],  # nothing at all
    ],
)
def test_the_directory_store_writes_a_gathered_payload_and_its_token_is_the_blake3(tmp_path: Path, sizes: list[int]) -> None:
    """The token is the content's BLAKE3, so a BLAKE3 run's blob costs one hash; a sha256 run's
    blob gets both digests from the same pass over the chunks written."""
    pieces = _pieces(len(sizes), sizes)
    whole = b"".join(pieces)
    expected = blake3.blake3(whole).hexdigest()
    sha256 = hashlib.sha256(whole).hexdigest()
    mailbox = FileMailbox(tmp_path)
    assert isinstance(mailbox, HashingPut) and isinstance(mailbox, HashingGet)
    assert mailbox.put_hashed("blobs/gathered", Gathered(pieces), "blake3") == (expected, expected)
    assert (tmp_path / "blobs" / "gathered").read_bytes() == whole
    assert mailbox.get_hashed("blobs/gathered", "blake3") == (whole, expected)
    assert mailbox.get_hashed("blobs/gathered", "sha256") == (whole, sha256)
    assert mailbox.get_versioned("blobs/gathered")[1] == expected == mailbox.head("blobs/gathered").token  # type: ignore[union-attr]
    assert mailbox.put_hashed("blobs/plain", whole, "sha256") == (expected, sha256)
    assert mailbox.put_hashed("blobs/sha256", Gathered(pieces), "sha256") == (expected, sha256)
    assert mailbox.create("blobs/created", whole) == expected == mailbox.swap("blobs/plain", whole, expected)
    assert sorted(p.name for p in (tmp_path / "blobs").iterdir()) == ["created", "gathered", "plain", "sha256"]  # no temp file


class _Recording(ForwardingMailbox):
    def __init__(self) -> None:
        super().__init__(_HashingMemory())
        self.seen: list[bytes] = []

    def put(self, key: str, data: bytes) -> str:
        self.seen.append(data)
        return self.inner.put(key, data)


class _HashingMemory(MemoryMailbox):
    def put_hashed(self, key: str, data: bytes | Gathered, digest: DigestName) -> tuple[str, str]:
        whole = data.join() if isinstance(data, Gathered) else data
        return self.put(key, whole), hashlib.sha256(whole).hexdigest()


def test_a_wrapper_that_overrides_put_sees_the_gathered_payload_joined() -> None:
    recording = _Recording()
    pieces = [b"head", b"", b"body" * 100]
    _, digest = recording.put_hashed("k", Gathered(pieces), "sha256")  # type: ignore[attr-defined]
    assert recording.seen == [b"".join(pieces)] and digest == hashlib.sha256(b"".join(pieces)).hexdigest()
