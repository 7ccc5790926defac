"""The S3 store's parallel download path: parts read straight into the result, bodies cut
short on the wire (through ``testing/fault_proxy.py`` against the real loopback
SeaweedFS), and the helpers that keep the result buffer safe."""

from __future__ import annotations

import gc
import hashlib
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import numpy as np
import pytest

from gradientmail.errors import MailboxUnavailable, ObjectTooLarge
from gradientmail.mailbox import S3Mailbox, S3Tuning
from gradientmail.mailbox import _s3_transfer as transfer
from testing.fault_proxy import FaultProxy
from tests.seaweedfs import S3Server

MiB = 1024 * 1024
SMALL_PARTS = S3Tuning(multipart_threshold_bytes=5 * MiB, part_size_bytes=5 * MiB, max_concurrency=4)


def _random_bytes(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).bytes(size)


class BodyBytes:
    """Counts the body bytes an S3 client takes from GetObject answers, by ``read`` and by
    ``readinto`` (the parallel download's way)."""

    def __init__(self, events: Any) -> None:
        self.count = 0
        self._lock = threading.Lock()
        events.register("after-call.s3.GetObject", self._received)

    def _received(self, parsed: dict[str, Any], **_: Any) -> None:
        body = parsed.get("Body")
        if body is None:
            return
        read, readinto = body.read, body.readinto

        def counting_read(amt: int | None = None) -> bytes:
            chunk: bytes = read(amt)
            self._add(len(chunk))
            return chunk

        def counting_readinto(buffer: Any) -> int:
            count: int = readinto(buffer)
            self._add(count)
            return count

        body.read, body.readinto = counting_read, counting_readinto

    def _add(self, count: int) -> None:
        with self._lock:
            self.count += count


def _session(server: S3Server) -> boto3.Session:
    return boto3.Session(aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key, region_name=server.region)


@pytest.fixture
def truncating_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    """A proxy in front of the server that injects nothing until configured."""
    with FaultProxy(s3_server.endpoint_url, rate=0.0, seed=13, kinds=("truncate",)) as proxy:
        yield proxy


# -- against the server -----------------------------------------------------------------


@pytest.mark.s3
def test_parts_are_read_into_one_bytes_without_a_second_copy(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server
) -> None:
    """The result is a ``bytes`` assembled in place: the download's peak allocation is
    about one payload (and a chunk per part in flight), not two (a bytearray and its copy)."""
    session = _session(s3_server)
    counted = BodyBytes(session.events)
    mailbox = make_s3_mailbox(session=session, tuning=SMALL_PARTS)
    payload = _random_bytes(1, 23 * MiB + 17)
    token = mailbox.put("blob", payload)
    counted.count = 0

    gc.collect()
    tracemalloc.start()
    try:
        data, read_token = mailbox.get_versioned("blob")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert type(data) is bytes
    assert (data, read_token) == (payload, token)
    assert counted.count == len(payload)  # every byte read once, by part
    assert peak < 1.5 * len(payload), f"peak {peak / MiB:.1f} MiB for a {len(payload) / MiB:.1f} MiB payload"


@pytest.mark.s3
def test_a_refused_object_reads_no_body_by_either_way(make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server) -> None:
    session = _session(s3_server)
    counted = BodyBytes(session.events)
    mailbox = make_s3_mailbox(session=session, tuning=SMALL_PARTS)
    mailbox.put("blob", _random_bytes(2, 12 * MiB))
    counted.count = 0
    with pytest.raises(ObjectTooLarge, match="more than the"):
        mailbox.get("blob", max_bytes=7 * MiB)
    assert counted.count == 0


@pytest.mark.s3
@pytest.mark.parametrize("size", [0, 1, 5 * MiB - 1, 5 * MiB, 5 * MiB + 1, 10 * MiB, 16 * MiB + 3])
def test_sizes_around_the_part_boundaries(make_s3_mailbox: Callable[..., S3Mailbox], size: int) -> None:
    mailbox = make_s3_mailbox(tuning=SMALL_PARTS)
    payload = _random_bytes(size, size)
    token = mailbox.put("blob", payload)
    assert mailbox.get_versioned("blob") == (payload, token)
    assert mailbox.get("blob", max_bytes=size) == payload


@pytest.mark.s3
@pytest.mark.parametrize("faults", [1, 3])
def test_bodies_cut_short_on_the_wire_are_fetched_again(
    make_s3_mailbox: Callable[..., S3Mailbox],
    s3_server: S3Server,
    truncating_proxy: FaultProxy,
    faults: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The proxy sends a part's full Content-Length, part of its body, then closes: the
    download asks for that part again (the first one too, which is read while the
    others are in flight) and returns every byte, never fewer."""
    writer = make_s3_mailbox(tuning=SMALL_PARTS)
    payload = _random_bytes(3, 22 * MiB)
    token = writer.put("blob", payload)
    reader = make_s3_mailbox(writer.prefix, tuning=SMALL_PARTS, endpoint_url=truncating_proxy.endpoint_url)
    reader.head("blob")  # connect before the faults start
    fetches: list[tuple[str, int]] = []
    fetch_into = transfer._fetch_into

    def spy(client: Any, params: dict[str, Any], view: memoryview, max_attempts: int, *, first_attempt: int = 1) -> None:
        fetches.append((params["Range"], first_attempt))
        fetch_into(client, params, view, max_attempts, first_attempt=first_attempt)

    monkeypatch.setattr(transfer, "_fetch_into", spy)
    truncating_proxy.max_faults = faults
    truncating_proxy.configure(rate=1.0)
    assert reader.get_versioned("blob") == (payload, token)
    # the first request to arrive is part one's (the others wait for its headers): it is
    # the one cut short, and asked for again while the others are read
    assert (f"bytes=0-{5 * MiB - 1}", 2) in fetches
    assert truncating_proxy.counts()["truncate"] >= faults  # parallel requests may overshoot the bound


@pytest.mark.s3
@pytest.mark.parametrize("size", [3 * MiB, 22 * MiB])
def test_a_body_cut_short_with_no_tries_left_is_an_error_not_short_data(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server, truncating_proxy: FaultProxy, size: int
) -> None:
    writer = make_s3_mailbox(tuning=SMALL_PARTS)
    writer.put("blob", _random_bytes(4, size))
    tuning = S3Tuning(multipart_threshold_bytes=5 * MiB, part_size_bytes=5 * MiB, max_attempts=1)
    reader = make_s3_mailbox(writer.prefix, tuning=tuning, endpoint_url=truncating_proxy.endpoint_url)
    reader.head("blob")
    truncating_proxy.configure(rate=1.0)
    with pytest.raises(MailboxUnavailable) as failure:
        reader.get("blob")
    assert _views_left_in(failure.value) == []  # the buffer is gone: nothing may still see it


def _views_left_in(error: BaseException) -> list[str]:
    """Usable memoryviews held by the frames of ``error``'s traceback and what it chains."""
    found: list[str] = []
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        trace = current.__traceback__
        while trace is not None:
            for name, value in trace.tb_frame.f_locals.items():
                if isinstance(value, memoryview):
                    try:
                        len(value)
                    except ValueError:
                        continue  # released
                    found.append(f"{trace.tb_frame.f_code.co_name}: {name}")
            trace = trace.tb_next
        pending += [current.__cause__, current.__context__]
    return found


# -- the helpers, without a server -------------------------------------------------------


def test_assemble_fills_a_bytes_in_place_and_never_returns_short() -> None:
    seen: list[int] = []

    def fill(view: memoryview) -> None:
        seen.append(len(view))
        view[:] = bytes(range(256)) * (len(view) // 256)

    data = transfer._assemble(4096, fill)
    assert type(data) is bytes and data == bytes(range(256)) * 16
    assert seen == [4096]  # one call with the whole result

    def broken(view: memoryview) -> None:
        view[:10] = b"x" * 10
        raise MailboxUnavailable("the store went away")

    with pytest.raises(MailboxUnavailable):
        transfer._assemble(4096, broken)


def test_the_filler_also_serves_a_runtime_that_reads_in_windows() -> None:
    filler = transfer._Filler(1000, lambda view: view.__setitem__(slice(None), bytes(range(250)) * 4))
    out = bytearray()
    window = bytearray(300)
    while count := filler.readinto(window):
        out += window[:count]
    assert bytes(out) == bytes(range(250)) * 4


def test_run_all_runs_here_alongside_and_waits_for_every_task_before_raising() -> None:
    finished: list[str] = []
    started = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.2)
        finished.append("slow")
        return "slow"

    def here() -> None:
        assert started.wait(5)  # the tasks run while ``here`` does
        raise MailboxUnavailable("here failed")

    with ThreadPoolExecutor(2) as executor:
        with pytest.raises(MailboxUnavailable, match="here failed"):
            transfer.run_all(executor, [slow], here=here)
        assert finished == ["slow"]  # it did not outlive the call

        def fails() -> str:
            raise ValueError("task failed")

        with pytest.raises(ValueError, match="task failed"):
            transfer.run_all(executor, [slow, fails, slow, slow])
        assert transfer.run_all(executor, [lambda: 1, lambda: 2], here=lambda: None) == [1, 2]


def test_a_wait_interrupted_by_a_signal_still_waits_for_the_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """KeyboardInterrupt during the wait must not free a buffer a task still writes to."""
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.2)
        finished.set()

    real_wait = transfer.wait
    calls = {"n": 0}

    def interrupted_wait(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:  # the wait for the first failure, and the first wait it out
            raise KeyboardInterrupt
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(transfer, "wait", interrupted_wait)
    with ThreadPoolExecutor(1) as executor, pytest.raises(KeyboardInterrupt):
        transfer.run_all(executor, [slow])
    assert finished.is_set()


# -- the benchmark's delayed link ----------------------------------------------------------


@pytest.mark.s3
def test_the_delay_link_passes_s3_through_and_bounds_each_connection(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server
) -> None:
    """testing/delay_proxy.py: byte for byte (signed requests, ranges, conditions), and
    one connection carries at most window / rtt."""
    from testing.delay_proxy import DelayLink

    payload = _random_bytes(5, 2 * MiB)
    with DelayLink.spawn("127.0.0.1", s3_server.port, rtt_ms=20, window_kib=256) as link:
        mailbox = make_s3_mailbox(tuning=SMALL_PARTS, endpoint_url=link.endpoint_url)
        token = mailbox.create("blob", payload)
        started = time.perf_counter()
        assert mailbox.get_versioned("blob") == (payload, token)  # one request: under one part
        elapsed = time.perf_counter() - started
    assert elapsed >= 0.8 * len(payload) / (link.per_connection_mb_s * 1e6)


# -- hashing while downloading (issue 13) ---------------------------------------------------


class _Recording:
    """A sha256 that remembers where each stretch it was fed ended."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.ends: list[int] = []

    def update(self, data: Any, /) -> None:
        self._hash.update(data)
        self.ends.append((self.ends[-1] if self.ends else 0) + memoryview(data).nbytes)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


@pytest.mark.s3
@pytest.mark.parametrize("size", [0, 1, 5 * MiB - 1, 5 * MiB + 1, 16 * MiB + 3, 31 * MiB])
def test_get_hashed_hashes_exactly_the_bytes_returned(make_s3_mailbox: Callable[..., S3Mailbox], size: int) -> None:
    mailbox = make_s3_mailbox(tuning=SMALL_PARTS)
    payload = _random_bytes(size + 7, size)
    mailbox.put("blob", payload)
    assert mailbox.get_hashed("blob", "sha256") == (payload, hashlib.sha256(payload).hexdigest())
    assert mailbox.get_hashed("blob", "sha256", max_bytes=size) == (payload, hashlib.sha256(payload).hexdigest())
    if size:
        with pytest.raises(ObjectTooLarge):
            mailbox.get_hashed("blob", "sha256", max_bytes=size - 1)


@pytest.mark.s3
def test_the_hash_is_fed_in_order_in_whole_parts(make_s3_mailbox: Callable[..., S3Mailbox]) -> None:
    mailbox = make_s3_mailbox(tuning=SMALL_PARTS)
    payload = _random_bytes(21, 23 * MiB)
    mailbox.put("blob", payload)
    recorded: list[_Recording] = []

    def hasher() -> _Recording:
        recorded.append(_Recording())
        return recorded[-1]

    with ThreadPoolExecutor(4) as executor:
        data, _, digest, _ = transfer.download(
            mailbox._client(),
            executor,
            bucket=mailbox.bucket,
            key=f"{mailbox.prefix}/blob",
            part_bytes=5 * MiB,
            max_attempts=3,
            hasher=hasher,
        )
    assert data == payload and digest == hashlib.sha256(payload).hexdigest()
    assert len(recorded) == 1
    ends = recorded[0].ends
    assert ends[-1] == len(payload)
    assert all(end % (5 * MiB) == 0 for end in ends[:-1])  # whole parts, contiguous from the start


@pytest.mark.s3
def test_get_hashed_survives_bodies_cut_short_and_fails_cleanly_without_tries(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server, truncating_proxy: FaultProxy
) -> None:
    writer = make_s3_mailbox(tuning=SMALL_PARTS)
    payload = _random_bytes(5, 22 * MiB)
    writer.put("blob", payload)
    reader = make_s3_mailbox(writer.prefix, tuning=SMALL_PARTS, endpoint_url=truncating_proxy.endpoint_url)
    reader.head("blob")
    truncating_proxy.max_faults = 3
    truncating_proxy.configure(rate=1.0)
    assert reader.get_hashed("blob", "sha256") == (payload, hashlib.sha256(payload).hexdigest())

    tuning = S3Tuning(multipart_threshold_bytes=5 * MiB, part_size_bytes=5 * MiB, max_attempts=1)
    hopeless = make_s3_mailbox(writer.prefix, tuning=tuning, endpoint_url=truncating_proxy.endpoint_url)
    hopeless.head("blob")
    truncating_proxy.max_faults = None
    truncating_proxy.configure(rate=1.0)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            hopeless.get_hashed("blob", "sha256")
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the hashing wait hung on a failed part"
    assert len(outcome) == 1 and isinstance(outcome[0], MailboxUnavailable)
    assert _views_left_in(outcome[0]) == []


@pytest.mark.s3
@pytest.mark.parametrize("read", ["get_versioned", "get_hashed"])
def test_a_download_restarted_on_a_replaced_object_returns_and_hashes_the_new_one_only(
    make_s3_mailbox: Callable[..., S3Mailbox], s3_server: S3Server, read: str
) -> None:
    """An object replaced between a download's first and later parts is fetched again whole:
    never a mix of two versions, the token and digest are the new object's."""
    session = _session(s3_server)
    mailbox = make_s3_mailbox(session=session, tuning=SMALL_PARTS)
    rival = make_s3_mailbox(mailbox.prefix, tuning=SMALL_PARTS)
    old, new = _random_bytes(8, 11 * MiB), _random_bytes(9, 12 * MiB)
    mailbox.put("blob", old)
    replaced = threading.Event()

    def replace_once(params: dict[str, Any], **_: Any) -> None:
        if params.get("Range", "bytes=0-").startswith("bytes=0-") or replaced.is_set():
            return
        replaced.set()
        rival.put("blob", new)

    session.events.register("provide-client-params.s3.GetObject", replace_once)
    fresh = make_s3_mailbox(mailbox.prefix, session=session, tuning=SMALL_PARTS)
    if read == "get_hashed":
        assert fresh.get_hashed("blob", "sha256") == (new, hashlib.sha256(new).hexdigest())
    else:
        data, token = fresh.get_versioned("blob")
        assert data == new
        assert token == rival.head("blob").token  # type: ignore[union-attr]
    assert replaced.is_set()
