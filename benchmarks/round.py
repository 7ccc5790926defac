"""One syncer round end to end on loopback SeaweedFS, against the plain-boto3 floor of its bytes;
and the S3 requests a run makes, per committed round and per idle learner, with their cost.

    python -m benchmarks.round [--m 8] [--mb 256] [--merge rda|weighted_mean|both]

Part 1, the round (once per merge): ``--m`` learners publish a contribution of a one-fragment fp32
model of ``--mb`` MB each through ``RunStore.publish_contribution`` (as a learner's exchange does);
then one pass of the real syncer (``SyncerRuntime.run_once``) lists, fetches, verifies, validates,
merges, steps, encodes, puts and commits the round. Phases are timed by wrappers in this process:
a mailbox that times every call it forwards, timers around the payload codec and sha256, and the
syncer's own phase timestamps (the telemetry recorder hook). The floor: in the same run, plain
boto3 GETs the same payload objects and PUTs objects of the sizes the round wrote, once as single
sequential requests and once with s3transfer (``download_fileobj``/``upload_fileobj``); the floor
is the faster of the two. Target: whole round ≤ 1.3× floor. ``--rounds-only`` times just the
rounds: each merge with each ``--arithmetic`` (the run's ``merge_arithmetic``), ``--repeat`` times
interleaved, the verdict on the median; ``--sweep 2x64,4x64,...`` fits round time to M × MB
(target R² ≥ 0.98) beside the floor's own fit; ``--grid 2,4,8,16x16,64,256`` times every M with
every MB instead (the first merge), ``--repeat`` times interleaved, and prints each phase against
its floor: whole round ÷ floor, collect ÷ the floor's GETs and ÷ those GETs hashing every body
with the run's digest (target at M = 2, 4, 8 × 256 MB: ≤ 1.2×), write ÷ the PUTs. ``--digest
blake3|sha256|both`` is the runs' blob digest (default: a new run's, BLAKE3); ``both`` runs each
round with each, interleaved (each first in every other repeat, after one untimed round that grows
the process's heap), and prints each round's BLAKE3 ÷ sha256, paired by repeat. ``--transfer-threads
2,4,8`` adds arms of the syncer's ``S3Tuning.max_concurrency`` the same way, each ÷ the default's.

Part 2, requests: every mailbox gets a ``boto3.Session`` with botocore event hooks counting its
requests by operation (``benchmarks/s3_requests.py``). Per committed round: the syncer's closing
pass, each learner's publish and each learner's fetch of the commit (``newest_version``,
``read_round``, ``read_params``: what the exchange does when a commit appears), for M = 2, 4, 8 at
``--count-mb`` and for the timed round at ``--mb``. Idle: real ``gm.Session`` learners at the
shipped defaults (NumPy model; every node also stands for syncer) joined to a run, not stepping,
for ``--idle-s`` seconds after ``--settle-s``, 1, 3 and 8 of them (``--idle-only`` measures just
these and judges their target alone: no rounds, no training, no cost). Training: ``--train-learners``
real sessions at the defaults stepping on threads so that the run commits once per
``--train-period-s`` (8 learners, once a minute), counted for ``--train-s`` seconds: a day of
their requests at AWS S3 list prices, beside the model (rounds × the round's requests + a day of
idle polling). Targets: idle ≤ 1 request per learner per second (the worst learner count), and
the measured day ≤ $6.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import itertools
import json
import logging
import math
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import gradientmail as gm
from benchmarks import s3_requests
from benchmarks.cpu import CpuSpan, add_memory_option, apply_memory_option, cpu_span
from benchmarks.s3_requests import RequestCounter, counting_session
from benchmarks.targets import DEFAULTS, MIN_RUNS, at_least, at_most, information, verdict
from gradientmail.backends import get_backend, payload
from gradientmail.digests import DEFAULT_BLOB_DIGEST, DIGESTS, DigestName, hex_digest
from gradientmail.mailbox import S3Tuning
from gradientmail.mailbox.base import Gathered, HashingGet, HashingPut, joined
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, RunStore
from gradientmail.store import run_store as run_store_module
from gradientmail.syncer import SyncerRuntime
from gradientmail.telemetry import hooks as telemetry_hooks
from testing.seaweed import S3Endpoint, Seaweed

ROOT = Path(__file__).resolve().parent.parent
TARGET_R2 = 0.98
"""Round time against M × fragment bytes over the sweep: a straight line (issue 25)."""
TARGET_RATIO = 1.3
STEPS = 10
SAMPLES = 80
TENSORS = 4
LEASE_TTL_S = 600.0
"""The timed rounds' lease TTL (see ``one_round``)."""
"""The fragment's parameters are split into this many equal tensors."""
ROUNDS_PER_DAY = 1440
TARGET_IDLE_PER_S = 1.0
"""Idle requests per learner per second at the shipped defaults (the speed issue's target)."""
TARGET_USD_PER_DAY = 6.0
"""8 learners committing once a minute, a day of their requests at list prices."""
DAY_S = 86400.0
COST_LEARNERS = 8
ROUND_INTERVAL_S = 60.0
log = logging.getLogger("benchmarks.round")


# -- timing --------------------------------------------------------------------------------------
@dataclass
class Call:
    op: str
    key: str
    start: float
    end: float
    nbytes: int

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class CallLog:
    """Every timed call in this process while recording (mailbox calls, codec, sha256)."""

    calls: list[Call] = field(default_factory=list)
    recording: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: str, key: str, start: float, nbytes: int) -> None:
        if self.recording:
            with self.lock:
                self.calls.append(Call(op, key, start, time.monotonic(), nbytes))

    def select(self, op: str, after: float = -math.inf, before: float = math.inf, where: Callable[[str], bool] | None = None):
        return [c for c in self.calls if c.op == op and after <= c.start < before and (where is None or where(c.key))]


class TimedMailbox:
    """A mailbox that forwards every call to ``inner`` and logs its duration and bytes."""

    def __init__(self, inner: gm.Mailbox, calls: CallLog) -> None:
        self._inner = inner
        self._calls = calls

    @property
    def url(self) -> str:
        return self._inner.url

    def _timed(self, op: str, key: str, fn: Callable[[], Any], size: Callable[[Any], int]) -> Any:
        start = time.monotonic()
        result = fn()
        self._calls.add(op, key, start, size(result))
        return result

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        return self._timed("get", key, lambda: self._inner.get(key, max_bytes=max_bytes), len)

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        return self._timed("get", key, lambda: self._inner.get_versioned(key, max_bytes=max_bytes), lambda r: len(r[0]))

    def get_hashed(self, key: str, digest: DigestName, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """The store's hashing read (``HashingGet``) where it has one, logged as a GET (the hash
        runs inside it, while the parts stream); else a GET and the hash apart."""
        inner = self._inner
        if isinstance(inner, HashingGet):
            return self._timed("get", key, lambda: inner.get_hashed(key, digest, max_bytes=max_bytes), lambda r: len(r[0]))
        data = self.get(key, max_bytes=max_bytes)
        return data, hex_digest(digest, data)

    def head(self, key: str) -> Any:
        return self._timed("head", key, lambda: self._inner.head(key), lambda _: 0)

    def exists(self, key: str) -> bool:
        return self._timed("head", key, lambda: self._inner.exists(key), lambda _: 0)

    def list(self, prefix: str = "") -> list[str]:
        return self._timed("list", prefix, lambda: self._inner.list(prefix), lambda _: 0)

    def put(self, key: str, data: bytes) -> str:
        return self._timed("put", key, lambda: self._inner.put(key, data), lambda _: len(data))

    def put_hashed(self, key: str, data: bytes | Gathered, digest: DigestName) -> tuple[str, str]:
        """The store's hashing write (``HashingPut``, a gathered blob sent out of its pieces)
        where it has one, logged as a PUT (the hash runs inside it, while the parts go); else
        the pieces joined, a PUT and the hash apart."""
        inner = self._inner
        if isinstance(inner, HashingPut):
            return self._timed("put", key, lambda: inner.put_hashed(key, data, digest), lambda _: len(data))
        whole = joined(data)
        return self.put(key, whole), hex_digest(digest, whole)

    def create(self, key: str, data: bytes) -> str:
        return self._timed("create", key, lambda: self._inner.create(key, data), lambda _: len(data))

    def swap(self, key: str, data: bytes, expected_token: str) -> str:
        return self._timed("swap", key, lambda: self._inner.swap(key, data, expected_token), lambda _: len(data))

    def delete(self, key: str) -> None:
        return self._timed("delete", key, lambda: self._inner.delete(key), lambda _: 0)

    def close(self) -> None:
        self._inner.close()


@contextmanager
def timed_codec(calls: CallLog) -> Iterator[None]:
    """Time the payload codec and the store's sha256 while inside (module attributes patched in this
    benchmark process only; only the round's threads, the syncer's and its helpers, use them meanwhile)."""
    originals = (payload.encode, payload.decode, run_store_module.sha256_hex, payload.encode_pieces)

    def timed(op: str, fn: Callable[..., Any], sized: Callable[[tuple[Any, ...], Any], Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            result = fn(*args, **kwargs)
            calls.add(op, "", start, _size(sized(args, result)))
            return result

        return wrapper

    encode = timed("encode", originals[0], lambda args, result: result)
    decode = timed("decode", originals[1], lambda args, result: args[0] if args else None)
    sha256_hex = timed("sha256", originals[2], lambda args, result: args[0] if args else None)
    pieces = timed("encode", originals[3], lambda args, result: sum(len(memoryview(p).cast("B")) for p in result))
    payload.encode, payload.decode, run_store_module.sha256_hex, payload.encode_pieces = encode, decode, sha256_hex, pieces
    try:
        yield
    finally:
        payload.encode, payload.decode, run_store_module.sha256_hex, payload.encode_pieces = originals


def _size(data: Any) -> int:
    try:
        return memoryview(data).nbytes
    except TypeError:
        return 0


class PhaseRecorder:
    """The telemetry recorder hook: keeps the syncer's phase timestamps of each committed round."""

    def __init__(self) -> None:
        self.phases: list[telemetry_hooks.RoundPhases] = []

    def syncer_attached(self, runtime: Any) -> None:
        pass

    def round_committed(self, runtime: Any, fragment: int, record: Any, phases: telemetry_hooks.RoundPhases) -> None:
        self.phases.append(phases)


# -- S3 set-up -------------------------------------------------------------------------------------
def counted_mailbox(server: S3Endpoint, prefix: str, counter: RequestCounter, tuning: S3Tuning | None = None) -> gm.S3Mailbox:
    session = counting_session(server.access_key, server.secret_key, server.region, counter)
    return gm.S3Mailbox(
        server.bucket,
        prefix,
        endpoint_url=server.endpoint_url,
        region=server.region,
        addressing_style="path",
        session=session,
        tuning=tuning,
    )


DEFAULT_TRANSFER_THREADS = S3Tuning().max_concurrency
"""The S3 mailbox's parts or ranges in flight at its defaults: the arm a round is judged at."""


def model_of(mb: float) -> dict[str, np.ndarray]:
    numel = max(TENSORS, int(mb * 1e6 / 4)) // TENSORS
    return {f"block{i}.weight": np.zeros(numel, np.float32) for i in range(TENSORS)}


def merge_config(name: str) -> Any:
    return gm.Rda() if name == "rda" else gm.WeightedMean()


def _mbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


# -- the floor ------------------------------------------------------------------------------------
def boto3_floor(
    weed: Seaweed, object_keys: list[str], put_sizes: list[int], scratch_prefix: str, digest: DigestName = "sha256"
) -> dict[str, Any]:
    """GET ``object_keys`` and PUT objects of ``put_sizes`` with plain boto3: sequential single
    requests, and s3transfer. Returns seconds and bytes of each; ``floor_s`` is the faster total.
    The hashed single requests take ``digest`` (the run's) of every body."""
    from boto3.s3.transfer import TransferConfig

    client = weed.client(max_pool_connections=16)
    bucket = weed.server.bucket
    blob = np.random.default_rng(1).bytes(max(put_sizes, default=0))
    out: dict[str, Any] = {}
    # sequential single requests
    server_pid = weed.process.pid
    got = 0
    with cpu_span(server_pid) as get_cpu:
        for key in object_keys:
            got += len(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    out["single_get_s"] = get_cpu.wall_s
    with cpu_span(server_pid) as put_cpu:
        for i, size in enumerate(put_sizes):
            client.put_object(Bucket=bucket, Key=f"{scratch_prefix}/single-{i}", Body=blob[:size])
    out["single_put_s"] = put_cpu.wall_s
    out["single_cpu"] = {"get": get_cpu.as_json(), "put": put_cpu.as_json(), "both": (get_cpu + put_cpu).as_json()}
    # the same single requests with the digest of every body (the run's: sha256 or BLAKE3) a plain
    # client would take to check or record a blob (the protocol's integrity, docs/protocol.md): a
    # reference beside the floor, what that hash alone costs on this machine
    start = time.monotonic()
    for key in object_keys:
        hex_digest(digest, client.get_object(Bucket=bucket, Key=key)["Body"].read())
    out["hashed_get_s"] = time.monotonic() - start
    out["digest"] = digest
    start = time.monotonic()
    for i, size in enumerate(put_sizes):
        body = blob[:size]
        hex_digest(digest, body)
        client.put_object(Bucket=bucket, Key=f"{scratch_prefix}/single-{i}", Body=body)
    out["hashed_put_s"] = time.monotonic() - start
    # s3transfer (boto3's managed transfers: parallel ranged GETs / multipart uploads)
    config = TransferConfig()
    start = time.monotonic()
    for key in object_keys:
        sink = io.BytesIO()
        client.download_fileobj(bucket, key, sink, Config=config)
    out["s3transfer_get_s"] = time.monotonic() - start
    start = time.monotonic()
    for i, size in enumerate(put_sizes):
        client.upload_fileobj(io.BytesIO(blob[:size]), bucket, f"{scratch_prefix}/transfer-{i}", Config=config)
    out["s3transfer_put_s"] = time.monotonic() - start
    for i in range(len(put_sizes)):
        for kind in ("single", "transfer"):
            client.delete_object(Bucket=bucket, Key=f"{scratch_prefix}/{kind}-{i}")
    client.close()
    out["get_bytes"] = got
    out["put_bytes"] = sum(put_sizes)
    out["single_s"] = out["single_get_s"] + out["single_put_s"]
    out["s3transfer_s"] = out["s3transfer_get_s"] + out["s3transfer_put_s"]
    out["hashed_s"] = out["hashed_get_s"] + out["hashed_put_s"]
    out["floor_s"] = min(out["single_s"], out["s3transfer_s"])
    out["floor_kind"] = "single requests" if out["single_s"] <= out["s3transfer_s"] else "s3transfer"
    return out


# -- one round ------------------------------------------------------------------------------------
def one_round(
    weed: Seaweed,
    merge: str,
    m: int,
    mb: float,
    *,
    floor: bool,
    arithmetic: str = "streamed",
    digest: DigestName = DEFAULT_BLOB_DIGEST,
    transfer_threads: int = DEFAULT_TRANSFER_THREADS,
) -> dict[str, Any]:
    """Publish ``m`` contributions, close the round with one syncer pass; time and count it.
    ``arithmetic``: the run's ``merge_arithmetic`` (``streamed``, the default, or ``normalized``);
    ``digest``: the run's ``blob_digest`` (BLAKE3, a new run's, or sha256, a run from before);
    ``transfer_threads``: the syncer's mailbox's ``S3Tuning.max_concurrency``."""
    server = weed.server
    prefix = f"bench-round/{merge}-{m}-{uuid.uuid4().hex[:8]}"
    counters = {name: RequestCounter() for name in ("syncer", "publishers", "fetcher")}
    calls = CallLog()
    syncer_box = counted_mailbox(server, prefix, counters["syncer"], S3Tuning(max_concurrency=transfer_threads))
    publisher_box = counted_mailbox(server, prefix, counters["publishers"])
    fetcher_box = counted_mailbox(server, prefix, counters["fetcher"])
    for box in (syncer_box, publisher_box, fetcher_box):
        box.exists("bench/warm-up")  # the mailbox's one-time bucket check (HeadBucket), outside the counts
    backend = get_backend("numpy")
    try:
        model = model_of(mb)
        algorithm = gm.DiLoCo(sync_every=STEPS, quorum_size=m, merge=merge_config(merge), merge_arithmetic=arithmetic)
        publisher = RunStore(publisher_box)
        # a long lease TTL: in a node the election renews on a thread of its own; here the syncer's
        # passes are called by hand and the publishing between two of them may outlast a short TTL
        proposal = RunProposal(algorithm, lease_ttl_s=LEASE_TTL_S, blob_digest=digest)
        spec, _ = join_run(publisher, backend, model, proposal, "learner-0")
        syncer_store = RunStore(TimedMailbox(syncer_box, calls))
        syncer_store.read_spec()  # as a syncer node does: its blobs are written under the run's digest
        syncer = SyncerRuntime(syncer_store, backend, spec, "syncer", poll_interval_s=0.2)
        syncer.run_once()  # elected; the base (version 0) loaded: the state between two rounds
        idle_before = counters["syncer"].requests()
        syncer.run_once()
        idle_pass = s3_requests.diff(counters["syncer"].requests(), idle_before)
        fetcher = RunStore(fetcher_box)

        rng = np.random.default_rng(0)
        publish_s = 0.0
        before = counters["publishers"].requests()
        blob_keys = []
        for i in range(m):
            delta = {name: (1e-3 * rng.standard_normal(a.size, dtype=np.float32)) for name, a in model.items()}
            start = time.monotonic()
            key = publisher.publish_contribution(
                f"learner-{i}", 0, 0, delta, ContributionCounts(steps=STEPS, samples=SAMPLES)
            ).key
            publish_s += time.monotonic() - start
            blob_keys.append(key.blob)
            del delta
        publish_requests = s3_requests.diff(counters["publishers"].requests(), before)

        recorder = PhaseRecorder()
        before = counters["syncer"].requests()
        telemetry_hooks.set_recorder(recorder)
        calls.recording = True
        try:
            with timed_codec(calls), cpu_span(weed.process.pid) as pass_cpu:
                started = time.monotonic()
                syncer.run_once()
                ended = time.monotonic()
        finally:
            calls.recording = False
            telemetry_hooks.set_recorder(None)
        round_requests = s3_requests.diff(counters["syncer"].requests(), before)
        if not recorder.phases:
            raise RuntimeError(f"the syncer pass committed no round ({syncer.commits} commits)")
        record = syncer_store.read_round(0, 1)
        if len(record.participants) != m:
            raise RuntimeError(f"{len(record.participants)} of {m} contributions merged; rejected: {record.rejected}")

        before = counters["fetcher"].requests()
        newest = fetcher.newest_version(0, known=0)
        fetched = fetcher.read_params(spec, fetcher.read_round(0, newest or 0))
        fetch_requests = s3_requests.diff(counters["fetcher"].requests(), before)
        del fetched

        result: dict[str, Any] = {
            "merge": merge,
            "arithmetic": arithmetic,
            "digest": digest,
            "transfer_threads": transfer_threads,
            "m": m,
            "mb": mb,
            "publish_s": publish_s,
            "requests": {
                "syncer_round_pass": round_requests,
                "syncer_idle_pass": idle_pass,
                "publish_per_learner": {op: n / m for op, n in publish_requests.items()},
                "fetch_commit_per_learner": fetch_requests,
            },
        }
        result["requests"]["per_round"] = s3_requests.add(
            round_requests, s3_requests.add(result["requests"]["publish_per_learner"], fetch_requests, scale=m)
        )
        phases, written = phase_table(calls, recorder.phases[0], started, ended, m)
        result["phases"] = phases
        result["whole_s"] = ended - started
        result["cpu"] = pass_cpu.as_json()
        result["fetched_bytes"] = recorder.phases[0].fetched_bytes
        result["written_bytes"] = sum(written)
        if floor:
            object_keys = [f"{prefix}/{k}" for k in blob_keys]
            result["floor"] = boto3_floor(weed, object_keys, written, f"{prefix}/floor", digest)
            result["ratio"] = result["whole_s"] / result["floor"]["floor_s"]
        return result
    finally:
        for box in (syncer_box, publisher_box, fetcher_box):
            box.close()


def phase_table(
    calls: CallLog, p: telemetry_hooks.RoundPhases, started: float, ended: float, m: int
) -> tuple[dict[str, dict[str, Any]], list[int]]:
    """Seconds and bytes of each phase of the timed pass, from the call log and the syncer's timestamps."""

    def is_contribution(key: str) -> bool:
        return "/contributions/" in key

    def total(selected: list[Call]) -> tuple[float, int]:
        return sum(c.seconds for c in selected), sum(c.nbytes for c in selected)

    collect_end = p.closing_at
    first_get = min((c.start for c in calls.select("get", where=is_contribution)), default=p.closing_at)
    lists = calls.select("list", before=first_get)
    record_gets = calls.select("get", before=collect_end, where=lambda k: is_contribution(k) and k.endswith(".json"))
    payload_gets = calls.select("get", before=collect_end, where=lambda k: is_contribution(k) and not k.endswith(".json"))
    sha_in = calls.select("sha256", before=collect_end)
    decodes = calls.select("decode", before=collect_end)
    encodes = calls.select("encode", after=p.stepped_at)
    sha_out = calls.select("sha256", after=p.stepped_at)
    blob_puts = calls.select("put", after=p.stepped_at, before=p.committed_at, where=lambda k: k.endswith(".safetensors"))
    records = [c for op in ("create", "put", "get") for c in calls.select(op, after=p.stepped_at, before=p.committed_at + 1e-9)]
    records = [c for c in records if c.key.endswith(".json")]
    fetch_s, fetch_b = total(payload_gets)
    rec_s, rec_b = total(record_gets)
    sha_s, sha_b = total(sha_in)
    dec_s, dec_b = total(decodes)
    enc_s, enc_b = total(encodes)
    shao_s, _ = total(sha_out)
    put_s, put_b = total(blob_puts)
    commit_s, commit_b = total(records)
    # Each blob is hashed on another thread while it uploads: the span of the writes, not their sum.
    writes = encodes + sha_out + blob_puts
    write_s = max(c.end for c in writes) - min(c.start for c in writes) if writes else 0.0
    collect, write = COLLECT_PHASE, WRITE_PHASE
    rows = {
        "poll+list (election, leases, head probe, LIST)": (first_get - started, 0),
        "  of which LIST": total(lists),
        collect: (p.fetch_s, fetch_b),
        "fetch contribution records": (rec_s, rec_b),
        "fetch payloads (ranged GETs)": (fetch_s, fetch_b),
        "verify sha256": (sha_s, sha_b),
        "decode": (dec_s, dec_b),
        "merge": (p.merged_at - p.closing_at, fetch_b),
        "outer step": (p.stepped_at - p.merged_at, 0),
        write: (write_s, put_b),
        "encode": (enc_s, enc_b),
        "sha256 of the new blobs": (shao_s, enc_b),
        "put params + outer state": (put_s, put_b),
        "commit (read head, create record once, put head)": (commit_s, commit_b),
        "other (finiteness of the result, to NumPy)": (
            max(0.0, p.committed_at - p.stepped_at - write_s - commit_s),
            0,
        ),
        "retention (LIST, DELETE)": (ended - p.committed_at, 0),
    }
    # Parts of an overlapped phase: seconds summed over the threads that ran them (the payload
    # GETs include the sha256 a hashing store takes while they stream; "verify sha256" is what
    # was hashed apart, for stores that do not). Not added into the whole.
    part_of = {
        "fetch contribution records": collect,
        "fetch payloads (ranged GETs)": collect,
        "verify sha256": collect,
        "decode": collect,
        "encode": write,
        "sha256 of the new blobs": write,
        "put params + outer state": write,
    }
    phases: dict[str, dict[str, Any]] = {
        name: {"s": s, "bytes": b, "GB/s": _mbps(b, s) if b else None, "part_of": part_of.get(name)}
        for name, (s, b) in rows.items()
    }
    accounted = sum(v["s"] for k, v in phases.items() if not k.startswith(" ") and v["part_of"] is None)
    phases["unaccounted"] = {"s": (ended - started) - accounted, "bytes": 0, "GB/s": None, "part_of": None}
    written = [c.nbytes for c in blob_puts] + [c.nbytes for c in records if c.op in ("create", "put")]
    return phases, written


# -- idle and training learners -------------------------------------------------------------------
def idle_learners(weed: Seaweed, k: int, idle_s: float, settle_s: float = 1.5) -> dict[str, Any]:
    """``k`` real ``gm.Session`` learners (the shipped defaults) joined to one run, idle for ``idle_s``."""
    return _learners(weed, k, idle_s, settle_s, step_s=None)


def training_learners(weed: Seaweed, k: int, period_s: float, seconds: float, settle_s: float) -> dict[str, Any]:
    """``k`` real ``gm.Session`` learners (the shipped defaults, ``sync_every=SYNC_EVERY``), each
    stepping every ``period_s / SYNC_EVERY`` seconds on its own thread, so that the run commits
    about once per ``period_s``; their requests for ``seconds`` after ``settle_s``, with the
    versions committed meanwhile."""
    return _learners(weed, k, seconds, settle_s, step_s=period_s / SYNC_EVERY)


SYNC_EVERY = 100


def _learners(weed: Seaweed, k: int, seconds: float, settle_s: float, *, step_s: float | None) -> dict[str, Any]:
    server = weed.server
    kind = "idle" if step_s is None else "train"
    prefix = f"bench-{kind}/{k}-{uuid.uuid4().hex[:8]}"
    counters = [RequestCounter() for _ in range(k)]
    boxes = [counted_mailbox(server, prefix, c) for c in counters]
    sessions: list[gm.Session] = []
    models: list[dict[str, np.ndarray]] = []
    stop = threading.Event()
    algorithm = gm.DiLoCo(sync_every=SYNC_EVERY)
    options = gm.SessionOptions()

    def train(session: gm.Session, model: dict[str, np.ndarray]) -> None:
        assert step_s is not None
        while not stop.is_set():
            model["layer.weight"] += np.float32(1e-4)
            session.step(samples=8)
            stop.wait(step_s)

    threads = []
    try:
        for i, box in enumerate(boxes):
            model = {"layer.weight": np.zeros(1024, np.float32)}
            session = gm.Session(
                model, algorithm=algorithm, mailbox=box, learner_id=f"{kind}-{i}", backend="numpy", options=options
            )
            session.open()
            sessions.append(session)
            models.append(model)
        if step_s is not None:
            threads = [threading.Thread(target=train, args=pair, daemon=True) for pair in zip(sessions, models, strict=True)]
            for thread in threads:
                thread.start()
        time.sleep(settle_s)  # the election settles; one-time checks done; training reaches its pace
        version_before = _newest(boxes[0])  # before the count begins, as the one after it ends
        before = [(c.requests(), c.purposes()) for c in counters]
        start = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - start
        after = [(c.requests(), c.purposes()) for c in counters]
        commits = _newest(boxes[0]) - version_before
        nodes = []
        for session, (b, b_for), (a, a_for) in zip(sessions, before, after, strict=True):
            syncer = session.syncer
            nodes.append({
                "learner": session.learner_id,
                "leader": bool(syncer and syncer.election.is_leader),
                "per_s": {op: n / elapsed for op, n in s3_requests.diff(a, b).items()},
                "per_s_by_purpose": {what: n / elapsed for what, n in s3_requests.diff(a_for, b_for).items()},
            })  # fmt: skip
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for session in sessions:
            session.close(wait=False)
        for box in boxes:
            box.close()
    total = s3_requests.add(*(n["per_s"] for n in nodes))
    return {
        "learners": k,
        "seconds": elapsed,
        "step_s": step_s,
        "commits": commits,
        "options": {"poll_interval_s": options.poll_interval_s, "lease_ttl_s": options.lease_ttl_s, "idle_poll_interval_s": None},
        "nodes": nodes,
        "total_per_s": total,
        "per_learner_per_s": {op: n / k for op, n in total.items()},
    }


def _newest(box: gm.S3Mailbox) -> int:
    return RunStore(box).newest_version(0) or 0


def idle_at(idle: list[dict[str, Any]], k: int) -> dict[str, float]:
    """All nodes' idle requests/s at ``k`` learners: measured, or extrapolated per operation from
    the two largest measurements, each learner's rate linear in the learner count and never
    falling (a conservative bound: only the elected node reads the learners' leases, so the
    per-learner rate falls towards a constant as learners are added)."""
    found = {run["learners"]: run for run in idle}
    if k in found:
        return found[k]["total_per_s"]
    runs = sorted(idle, key=lambda run: run["learners"])[-2:]
    if len(runs) == 1:
        return {op: n * k for op, n in runs[0]["per_learner_per_s"].items()}
    (k1, r1), (k2, r2) = ((run["learners"], run["per_learner_per_s"]) for run in runs)
    out = {}
    for op in set(r1) | set(r2):
        a, b = r1.get(op, 0.0), r2.get(op, 0.0)
        out[op] = (b + max(0.0, (b - a) / (k2 - k1)) * (k - k2)) * k
    return dict(sorted(out.items()))


# -- report ---------------------------------------------------------------------------------------
def fmt_counts(counts: dict[str, float]) -> str:
    return ", ".join(f"{op} {n:g}" for op, n in counts.items()) or "none"


def print_purposes(per_s: dict[str, float]) -> None:
    """One line per thing a node's requests were for (``s3_requests.purpose``), most first."""
    for what, n in sorted(per_s.items(), key=lambda item: -item[1]):
        print(f"      {n:5.2f}/s  {what}")


COLLECT_PHASE = "collect (fetch, sha256, decode ahead ∥ validate)"
WRITE_PHASE = "write blobs (gathered: sha256 ∥ PUT out of the arrays, each)"
FIXED_PHASES = (
    "poll+list (election, leases, head probe, LIST)",
    "commit (read head, create record once, put head)",
    "retention (LIST, DELETE)",
    "unaccounted",
)
"""Phases whose seconds do not grow with the round's bytes."""


def phase_ratios(r: dict[str, Any]) -> dict[str, float]:
    """The round's transfer phases against the same transfers of the floor (the faster boto3 client
    of each direction): collect ÷ GETs, write blobs ÷ PUTs."""
    f, phases = r["floor"], r["phases"]
    get_s = min(f["single_get_s"], f["s3transfer_get_s"])
    put_s = min(f["single_put_s"], f["s3transfer_put_s"])
    return {"collect": phases[COLLECT_PHASE]["s"] / get_s, "write": phases[WRITE_PHASE]["s"] / put_s}


def cpu_ratio(r: dict[str, Any]) -> float:
    """CPU seconds of the pass, client and server together, ÷ those of the floor's single requests."""
    return CpuSpan.from_json(r["cpu"]).against(CpuSpan.from_json(r["floor"]["single_cpu"]["both"]))["both"]


def print_round(r: dict[str, Any]) -> None:
    print(
        f"\n== round: merge {r['merge']} ({r['arithmetic']}), M = {r['m']} contributions of {r['mb']:g} MB fp32, one fragment =="
    )
    print(f"  (publishing the {r['m']} contributions took {r['publish_s']:.2f} s, not part of the round)")
    print(f"  {'phase':<56} {'seconds':>8} {'MB':>9} {'GB/s':>7}")
    for name, v in r["phases"].items():
        rate = f"{v['GB/s']:7.2f}" if v["GB/s"] else f"{'':>7}"
        label = f"  · {name} (Σ threads)" if v.get("part_of") else name
        print(f"  {label:<56} {v['s']:8.3f} {v['bytes'] / 1e6:9.1f} {rate}")
    print(f"  {'whole round (one syncer pass)':<56} {r['whole_s']:8.3f}")
    f = r.get("floor")
    if f:
        print(
            f"  boto3 floor, same bytes ({f['get_bytes'] / 1e6:.0f} MB GET, {f['put_bytes'] / 1e6:.0f} MB PUT): "
            f"single requests {f['single_s']:.3f} s (GET {f['single_get_s']:.3f} + PUT {f['single_put_s']:.3f}), "
            f"s3transfer {f['s3transfer_s']:.3f} s (GET {f['s3transfer_get_s']:.3f} + PUT {f['s3transfer_put_s']:.3f})"
        )
        print(
            f"  whole / floor = {r['whole_s']:.3f} / {f['floor_s']:.3f} ({f['floor_kind']}) = {r['ratio']:.2f}× "
            f"(target ≤ {TARGET_RATIO}×; judged on the median of the repeats)"
        )
        if "hashed_s" in f:
            ratios = phase_ratios(r)
            print(
                f"  (information) single requests with the sha256 of every body {f['hashed_s']:.3f} s "
                f"(GET {f['hashed_get_s']:.3f} + PUT {f['hashed_put_s']:.3f}); "
                f"whole / that = {r['whole_s'] / f['hashed_s']:.2f}×; "
                f"collect / the floor's GET {ratios['collect']:.2f}×, write blobs / its PUT {ratios['write']:.2f}×"
            )
    if "cpu" in r:
        print(f"  CPU of the pass: {CpuSpan.from_json(r['cpu']).line()}")
    if f and "single_cpu" in f:
        floor_cpu = CpuSpan.from_json(f["single_cpu"]["both"])
        print(f"  CPU of the floor's single requests: {floor_cpu.line()}")
        if "cpu" in r:
            ratio = CpuSpan.from_json(r["cpu"]).against(floor_cpu)
            print(
                f"  (information) CPU-s of the pass ÷ the floor's: client {ratio['client']:.2f}×, "
                f"server {ratio['server']:.2f}×, both {ratio['both']:.2f}×"
            )
    q = r["requests"]
    print(f"  requests, syncer's closing pass: {fmt_counts(q['syncer_round_pass'])}")
    print(f"  requests, syncer's idle pass:    {fmt_counts(q['syncer_idle_pass'])}")
    print(f"  requests, one learner's publish: {fmt_counts(q['publish_per_learner'])}")
    print(f"  requests, one learner's fetch of the commit: {fmt_counts(q['fetch_commit_per_learner'])}")


def linear_fit(x: list[float], y: list[float]) -> dict[str, float]:
    """Least squares ``y ≈ intercept + slope·x`` and its R²."""
    xs, ys = np.array(x, float), np.array(y, float)
    slope, intercept = np.polyfit(xs, ys, 1)
    r2 = 1.0 - float(np.sum((ys - (intercept + slope * xs)) ** 2)) / float(np.sum((ys - ys.mean()) ** 2))
    return {"intercept_s": float(intercept), "s_per_mb": float(slope), "r2": r2}


def with_timed_round(
    training: dict[str, Any], per_round_timed: dict[str, float], small: dict[str, float] | None
) -> dict[str, Any]:
    """A day of the training learners' requests with each of their rounds' requests (a 4 KB
    fragment's, ``small``) replaced by the timed round's: the cost verdict's figure."""
    day_requests = {op: n * DAY_S for op, n in training["total_per_s"].items()}
    rounds_per_day = training["commits"] / training["seconds"] * DAY_S
    replaced = {
        op: (per_round_timed.get(op, 0.0) - (small or {}).get(op, 0.0)) * rounds_per_day
        for op in set(per_round_timed) | set(small or {})
    }
    return s3_requests.daily_cost(s3_requests.add(day_requests, replaced))


def rounds_only(args: argparse.Namespace) -> int:
    """The timed rounds alone: each merge with each arithmetic against the boto3 floor, in one
    run and one server; then, with ``--sweep``, how round time grows with M × fragment bytes."""
    merges = ["rda", "weighted_mean"] if args.merge == "both" else [args.merge]
    forms = ["normalized", "streamed"] if args.arithmetic == "both" else [args.arithmetic]
    if args.quick:
        args.mb, args.m = 1.0, 2
    sweep = [tuple(float(x) for x in item.split("x")) for item in args.sweep.split(",") if item]
    grid = parse_grid(args.grid)
    digests: list[DigestName] = list(DIGESTS) if args.digest == "both" else [args.digest]
    arms = [(digest, threads) for digest in digests for threads in parse_threads(args.transfer_threads)]
    out = args.json or ROOT / "runs" / f"round-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}" / "result.json"
    partial = out.with_name(out.stem + ".partial.json")
    logging.basicConfig(level=logging.WARNING)
    rounds: list[dict[str, Any]] = []
    swept: list[dict[str, Any]] = []
    gridded: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gm-round-") as scratch:
        weed = Seaweed.start(Path(scratch))
        try:
            if grid:  # the first round of a process grows its heap (freed memory is kept): not an arm's cost
                first_digest, first_threads = arms[0]
                warm = {"digest": first_digest, "transfer_threads": first_threads}
                one_round(weed, merges[0], *grid[0], floor=False, arithmetic=forms[-1], **warm)
            for repeat in range(args.repeat):  # interleaved, so a slow spell of the machine hits every arm
                for merge in merges if not grid else []:
                    for form in forms:
                        r = one_round(weed, merge, args.m, args.mb, floor=True, arithmetic=form)
                        r["repeat"] = repeat
                        print_round(r)
                        rounds.append(r)
                order = arms if repeat % 2 == 0 else arms[::-1]  # each arm first in every other repeat
                for (m, mb), (digest, threads) in itertools.product(grid, order):  # the grid, in place of the timed rounds
                    r = one_round(
                        weed, merges[0], m, mb, floor=True, arithmetic=forms[-1], digest=digest, transfer_threads=threads
                    )
                    r["repeat"] = repeat
                    gridded.append(r)
                    print(f"  grid repeat {repeat + 1}, {digest}, {threads} transfer threads: {grid_line(r)}")
                    partial.parent.mkdir(parents=True, exist_ok=True)  # a long grid keeps what it measured
                    partial.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "grid": gridded}))
            for m, mb in sweep:
                r = one_round(weed, merges[0], int(m), mb, floor=True, arithmetic=forms[-1])
                swept.append(r)
                ratios = phase_ratios(r)
                print(
                    f"  sweep M = {int(m):2d} × {mb:5g} MB ({r['arithmetic']}): {r['whole_s']:7.3f} s, "
                    f"floor {r['floor']['floor_s']:7.3f} s, {r['ratio']:.2f}×; collect ÷ GETs {ratios['collect']:.2f}×, "
                    f"write ÷ PUTs {ratios['write']:.2f}×, CPU-s ÷ the floor's {cpu_ratio(r):.2f}×"
                )
        finally:
            weed.stop()
    grid_judged = grid_verdicts(gridded, merges[0], forms[-1]) if gridded else []
    print("\n== targets ==")
    verdicts = [
        verdict(
            f"whole syncer round ≤ {TARGET_RATIO}× boto3 floor, {merge} ({form})",
            [r["ratio"] for r in rounds if (r["merge"], r["arithmetic"]) == (merge, form)],
            at_most(TARGET_RATIO),
            setting=DEFAULTS if form == "streamed" else f"merge_arithmetic={form}",
        )
        for merge in merges
        for form in forms
        if rounds
    ]
    for merge in merges:
        for form in forms:
            mine = [r for r in rounds if (r["merge"], r["arithmetic"]) == (merge, form) and "hashed_s" in r["floor"]]
            if not mine:
                continue
            verdicts += [
                information(
                    f"whole round ÷ single requests hashing every body, {merge} ({form})",
                    [r["whole_s"] / r["floor"]["hashed_s"] for r in mine],
                ),
                information(f"collect ÷ the floor's GETs, {merge} ({form})", [phase_ratios(r)["collect"] for r in mine]),
                information(f"write blobs ÷ the floor's PUTs, {merge} ({form})", [phase_ratios(r)["write"] for r in mine]),
                information(
                    f"CPU-s of the pass (client + server) ÷ the floor's single requests', {merge} ({form})",
                    [cpu_ratio(r) for r in mine],
                ),
            ]
    verdicts += grid_judged
    fit = None
    if len(swept) >= 3:
        x = [r["m"] * r["mb"] for r in swept]
        fit = {
            "round": linear_fit(x, [r["whole_s"] for r in swept]),
            "floor": linear_fit(x, [r["floor"]["floor_s"] for r in swept]),
        }
        line, floor_line = fit["round"], fit["floor"]
        detail = (
            f"{line['intercept_s']:.3f} s + {line['s_per_mb'] * 1000:.3f} ms/MB; the boto3 floor over the same sweep "
            f"{floor_line['s_per_mb'] * 1000:.3f} ms/MB, R² = {floor_line['r2']:.4f}"
        )
        verdicts.append(verdict(f"round time linear in M × MB, R² ≥ {TARGET_R2}", line["r2"], at_least(TARGET_R2), detail=detail))
    for v in verdicts:
        print(f"  {v.line('{:.4g}')}")
    out.parent.mkdir(parents=True, exist_ok=True)
    given = {k: str(v) for k, v in vars(args).items()}
    result = {
        "args": given,
        "rounds": rounds,
        "grid": gridded,
        "sweep": swept,
        "fit": fit,
        "targets": [v.as_json() for v in verdicts],
    }
    out.write_text(json.dumps(result, indent=2))
    print(f"\nresults: {out}")
    return 0


GRID_JUDGED_MB = 256.0
GRID_JUDGED_M = (2, 4, 8)
"""The grid's configurations the issue's targets name (M = 2, 4, 8 × 256 MB); the others are information."""
TARGET_COLLECT_RATIO = 1.2
"""Collect ≤ 1.2× the floor's GETs plus one hash pass (single requests hashing every body)."""


def parse_grid(text: str) -> list[tuple[int, float]]:
    """``2,4x16,64`` → every M with every MB: [(2, 16.0), (2, 64.0), (4, 16.0), (4, 64.0)]."""
    if not text:
        return []
    ms, sep, mbs = text.partition("x")
    try:
        configs = [(int(m), float(mb)) for m in ms.split(",") if m for mb in mbs.split(",") if mb]
    except ValueError:
        configs = []
    if not sep or not configs or any(m < 1 or mb <= 0 for m, mb in configs):
        raise SystemExit(f"benchmarks.round: --grid is M,M,...xMB,MB,... (e.g. 2,4,8,16x16,64,256), got {text!r}")
    return configs


def grid_phases(r: dict[str, Any]) -> dict[str, float]:
    """One grid round, each phase against its floor: the whole round ÷ the floor, collect ÷ the
    floor's GETs and ÷ those GETs hashing every body (the floor plus one hash pass), write ÷
    the PUTs; and the merge's and the outer step's seconds with the fixed cost (poll, commit,
    retention, unaccounted)."""
    f, phases = r["floor"], r["phases"]
    ratios = phase_ratios(r)
    fixed = sum(phases[name]["s"] for name in FIXED_PHASES)
    return {
        "whole": r["ratio"],
        "collect": ratios["collect"],
        "collect_hashed": phases[COLLECT_PHASE]["s"] / f["hashed_get_s"],
        "write": ratios["write"],
        "collect_gb_s": r["m"] * r["mb"] / 1e3 / phases[COLLECT_PHASE]["s"],
        "merge_s": phases["merge"]["s"],
        "step_s": phases["outer step"]["s"],
        "fixed_s": fixed,
    }


def grid_line(r: dict[str, Any]) -> str:
    g = grid_phases(r)
    return (
        f"M = {r['m']:2d} × {r['mb']:5g} MB: {r['whole_s']:7.3f} s, {g['whole']:.2f}× the floor; collect "
        f"{g['collect_gb_s']:.2f} GB/s, {g['collect']:.2f}× the GETs, {g['collect_hashed']:.2f}× GETs + "
        f"{r['floor'].get('digest', 'sha256')}; "
        f"write {g['write']:.2f}× the PUTs; merge {g['merge_s']:.3f} s, step {g['step_s']:.3f} s, fixed {g['fixed_s']:.3f} s"
    )


def grid_verdicts(gridded: list[dict[str, Any]], merge: str, form: str) -> list[Any]:
    """The grid's tables (medians over the repeats), one per run digest, and their verdicts: whole
    round ≤ 1.3× the floor and collect ≤ 1.2× the GETs hashing every body (with the run's digest)
    at the configurations the targets name, for the shipped digest (a new run's); information
    elsewhere, and for sha256 (a run from before). With both digests, each round's blake3 ÷ sha256
    (medians of the repeats' ratios, the two arms interleaved)."""
    verdicts = []
    arms = sorted({arm_of(r) for r in gridded}, key=lambda a: (a[0] != DEFAULT_BLOB_DIGEST, a[1] != DEFAULT_TRANSFER_THREADS, a))
    for arm in arms:
        verdicts += _grid_table([r for r in gridded if arm_of(r) == arm], merge, form, *arm)
    digest, threads = arms[0]
    if {"blake3", "sha256"} <= {d for d, _ in arms}:
        label = "blake3 ÷ sha256 blobs"
        verdicts += _paired_ab(gridded, merge, ("blake3", threads), ("sha256", threads), label, label)
    for other in sorted({t for _, t in arms} - {threads}):
        label = f"{other} ÷ {threads} transfer threads"
        verdicts += _paired_ab(gridded, merge, (digest, other), arms[0], label, f"{label}, {digest} blobs")
    return verdicts


def arm_of(r: dict[str, Any]) -> tuple[str, int]:
    """A grid round's arm: the run's blob digest and the syncer's transfer threads."""
    return r.get("digest", "sha256"), r.get("transfer_threads", DEFAULT_TRANSFER_THREADS)


def parse_threads(text: str) -> list[int]:
    """``4,8`` → [4, 8]: the transfer-thread arms (``S3Tuning.max_concurrency`` of the syncer's mailbox)."""
    try:
        threads = [int(x) for x in text.split(",") if x]
    except ValueError:
        threads = []
    if not threads or any(t < 1 for t in threads):
        raise SystemExit(f"benchmarks.round: --transfer-threads is N,N,... (each ≥ 1), got {text!r}")
    return threads


def _grid_table(gridded: list[dict[str, Any]], merge: str, form: str, digest: str, threads: int) -> list[Any]:
    configs = sorted({(r["m"], r["mb"]) for r in gridded}, key=lambda c: (c[1], c[0]))
    columns = ("whole", "collect", "collect_hashed", "write", "collect_gb_s", "merge_s", "step_s", "fixed_s")
    judged = digest == DEFAULT_BLOB_DIGEST and threads == DEFAULT_TRANSFER_THREADS
    print(
        f"\n== the round's phases against their floors, {merge} ({form}), {digest} blobs, {threads} transfer threads: "
        "medians of the repeats =="
    )
    print(
        f"  {'M × MB':>10} {'round÷floor':>12} {'collect÷GETs':>13} {'÷GETs+' + digest:>13} {'write÷PUTs':>11} "
        f"{'collect GB/s':>13} {'merge s':>8} {'step s':>7} {'fixed s':>8}"
    )
    verdicts = []
    for m, mb in configs:
        mine = [grid_phases(r) for r in gridded if (r["m"], r["mb"]) == (m, mb)]
        med = {c: statistics.median(g[c] for g in mine) for c in columns}
        print(
            f"  {f'{m} × {mb:g}':>10} {med['whole']:12.2f} {med['collect']:13.2f} {med['collect_hashed']:13.2f} "
            f"{med['write']:11.2f} {med['collect_gb_s']:13.2f} {med['merge_s']:8.3f} {med['step_s']:7.3f} {med['fixed_s']:8.3f}"
        )
        name = f"M = {m} × {mb:g} MB, {merge}, {digest} blobs" + (
            "" if threads == DEFAULT_TRANSFER_THREADS else f", {threads} transfer threads"
        )
        if judged and mb >= GRID_JUDGED_MB and m in GRID_JUDGED_M:
            verdicts += [
                verdict(
                    f"whole syncer round ≤ {TARGET_RATIO}× boto3 floor, {name}", [g["whole"] for g in mine], at_most(TARGET_RATIO)
                ),
                verdict(
                    f"collect ≤ {TARGET_COLLECT_RATIO}× the floor's GETs hashing every body ({digest}), {name}",
                    [g["collect_hashed"] for g in mine],
                    at_most(TARGET_COLLECT_RATIO),
                ),
            ]
        else:
            verdicts += [
                information(f"whole syncer round ÷ boto3 floor, {name}", [g["whole"] for g in mine]),
                information(
                    f"collect ÷ the floor's GETs hashing every body ({digest}), {name}", [g["collect_hashed"] for g in mine]
                ),
            ]
    return verdicts


Arm = tuple[str, int]
"""A grid round's arm: the run's blob digest and the syncer's transfer threads (``arm_of``)."""


def _paired_ab(gridded: list[dict[str, Any]], merge: str, other: Arm, base: Arm, label: str, heading: str) -> list[Any]:
    """Each configuration's round in arm ``other`` ÷ the same round in arm ``base``, paired by
    repeat (the arms run back to back): whole, collect, write and the pass's CPU-seconds. What a
    digest or a transfer-thread count buys end to end; ``label`` names the ratio, ``heading``
    the table."""
    by = {(r["m"], r["mb"], r["repeat"], arm_of(r)): r for r in gridded}
    configs = sorted({(r["m"], r["mb"]) for r in gridded}, key=lambda c: (c[1], c[0]))
    print(f"\n== {heading}, {merge}: medians of the paired repeats ==")
    print(f"  {'M × MB':>10} {'whole round':>12} {'collect':>8} {'write':>6} {'pass CPU-s':>11}")
    verdicts = []
    for m, mb in configs:
        pairs = [
            (by[(m, mb, k, other)], by[(m, mb, k, base)])
            for k in sorted({r["repeat"] for r in gridded})
            if (m, mb, k, other) in by and (m, mb, k, base) in by
        ]
        if not pairs:
            continue
        whole = [o["whole_s"] / b["whole_s"] for o, b in pairs]
        collect = [o["phases"][COLLECT_PHASE]["s"] / b["phases"][COLLECT_PHASE]["s"] for o, b in pairs]
        write = [o["phases"][WRITE_PHASE]["s"] / b["phases"][WRITE_PHASE]["s"] for o, b in pairs]
        cpu = [_pass_cpu_s(o) / _pass_cpu_s(b) for o, b in pairs]
        print(
            f"  {f'{m} × {mb:g}':>10} {statistics.median(whole):12.3f} {statistics.median(collect):8.3f} "
            f"{statistics.median(write):6.3f} {statistics.median(cpu):11.3f}"
        )
        verdicts += [
            information(f"whole round, {label}, M = {m} × {mb:g} MB, {merge}", whole),
            information(f"collect, {label}, M = {m} × {mb:g} MB, {merge}", collect),
            information(f"pass CPU-s (client + server), {label}, M = {m} × {mb:g} MB, {merge}", cpu),
        ]
    return verdicts


def _pass_cpu_s(r: dict[str, Any]) -> float:
    """CPU-seconds of a round's syncer pass, this process and the server together."""
    return float(r["cpu"]["total_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=8, help="contributions merged in the timed round")
    parser.add_argument("--mb", type=float, default=256.0, help="MB of fp32 per contribution (the fragment's size)")
    parser.add_argument("--merge", choices=("rda", "weighted_mean", "both"), default="both")
    parser.add_argument("--count-m", default="2,4,8", help="contribution counts of the request-count rounds")
    parser.add_argument("--count-mb", type=float, default=1.0, help="MB per contribution in the request-count rounds")
    parser.add_argument("--idle-learners", default="1,3,8", help="idle learner counts to measure")
    parser.add_argument("--idle-s", type=float, default=30.0, help="seconds of idling measured")
    parser.add_argument(
        "--settle-s", type=float, default=8.0, help="seconds idle learners run before counting (election, backoffs settle)"
    )
    parser.add_argument("--train-learners", type=int, default=COST_LEARNERS, help="learners of the training measurement")
    parser.add_argument("--train-period-s", type=float, default=ROUND_INTERVAL_S, help="their sync period (seconds)")
    parser.add_argument("--train-s", type=float, default=240.0, help="seconds of training measured")
    parser.add_argument("--train-settle-s", type=float, default=30.0, help="seconds they train before counting")
    parser.add_argument("--json", type=Path, default=None, help="default: runs/round-<UTC time>/result.json")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 MB, M = 2, 2 s idle, 1 and 2 idle learners")
    parser.add_argument(
        "--idle-only",
        action="store_true",
        help="measure the idle learners only and judge their target alone (no rounds, training or cost)",
    )
    parser.add_argument(
        "--rounds-only",
        action="store_true",
        help="time the rounds only (each merge × --arithmetic against the floor, and --sweep); no requests, idle or cost",
    )
    parser.add_argument(
        "--arithmetic",
        choices=("streamed", "normalized", "both"),
        default="streamed",
        help="the run's merge_arithmetic in the timed rounds (both: side by side, the same run)",
    )
    parser.add_argument(
        "--sweep",
        default="",
        help="with --rounds-only: rounds of M×MB, e.g. 2x64,4x64,8x64,16x64,8x16,8x256; round time fitted to the bytes (R²)",
    )
    parser.add_argument(
        "--grid",
        default="",
        help="with --rounds-only: every M with every MB (e.g. 2,4,8,16x16,64,256) instead of --m × --mb, "
        "--repeat times interleaved; each phase against its floor",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs of every judged figure (rounds per arm, idle and training; default 3, --quick 1); the median decides",
    )
    parser.add_argument(
        "--digest",
        choices=(*DIGESTS, "both"),
        default=DEFAULT_BLOB_DIGEST,
        help="the runs' blob digest in --rounds-only (both: each round with each, interleaved, and blake3 ÷ sha256)",
    )
    parser.add_argument(
        "--transfer-threads",
        default=str(DEFAULT_TRANSFER_THREADS),
        help="with --grid: the syncer's S3Tuning.max_concurrency, one arm each (e.g. 2,4,8; interleaved like the digests; "
        f"each ÷ the first that is the default, {DEFAULT_TRANSFER_THREADS})",
    )
    add_memory_option(parser, default="retained")  # as a gradientmail node runs
    args = parser.parse_args(argv)
    apply_memory_option(args.memory)
    if args.repeat is None:
        args.repeat = 1 if args.quick else MIN_RUNS
    if args.rounds_only:
        return rounds_only(args)
    if args.quick:
        args.mb, args.m, args.count_m, args.idle_learners, args.idle_s, args.settle_s = 1.0, 2, "2,3", "1,2", 2.0, 1.5
        args.train_learners, args.train_period_s, args.train_s, args.train_settle_s = 2, 3.0, 8.0, 4.0
    logging.basicConfig(level=logging.WARNING)
    merges = ["rda", "weighted_mean"] if args.merge == "both" else [args.merge]
    count_ms = sorted({int(x) for x in args.count_m.split(",") if x})
    idle_ks = sorted({int(x) for x in args.idle_learners.split(",") if x})
    out = args.json or ROOT / "runs" / f"round-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}" / "result.json"

    with tempfile.TemporaryDirectory(prefix="gm-round-") as scratch:
        weed = Seaweed.start(Path(scratch))
        try:
            tuning = S3Tuning()
            print(
                f"S3 mailbox tuning (defaults): multipart above {tuning.multipart_threshold_bytes >> 20} MiB, "
                f"parts of {tuning.part_size_bytes >> 20} MiB, {tuning.max_concurrency} in flight"
            )
            rounds: list[dict[str, Any]] = []
            counts = []
            idle_runs: list[list[dict[str, Any]]] = []
            training_runs: list[dict[str, Any]] = []
            for repeat in range(args.repeat):  # every judged figure, --repeat times (median decides)
                if not args.idle_only:
                    for merge in merges:
                        r = one_round(weed, merge, args.m, args.mb, floor=True)
                        r["repeat"] = repeat
                        print_round(r)
                        rounds.append(r)
                idle_runs.append([idle_learners(weed, k, args.idle_s, args.settle_s) for k in idle_ks])
                if not args.idle_only:  # --idle-only: the idle learners alone (training takes minutes per repeat)
                    training_runs.append(
                        training_learners(weed, args.train_learners, args.train_period_s, args.train_s, args.train_settle_s)
                    )
            if not args.idle_only:
                counts = [one_round(weed, merges[0], m, args.count_mb, floor=False) for m in count_ms]
            idle = idle_runs[-1]  # the detailed report shows the last repeat
        finally:
            weed.stop()

    print("\n== S3 requests per committed round (syncer's pass + each learner's publish and fetch) ==")
    print(f"  at {args.count_mb:g} MB per contribution, every learner contributing:")
    series = []
    for r in counts:
        per_round = r["requests"]["per_round"]
        series.append((r["m"], sum(per_round.values())))
        print(f"  M = {r['m']}: {sum(per_round.values()):5.0f} requests  ({fmt_counts(per_round)})")
    grows = all(b[1] > a[1] for a, b in itertools.pairwise(series)) if len(series) > 1 else None
    fit = None
    if len(series) >= 2:
        ms, ns = np.array([s[0] for s in series], float), np.array([s[1] for s in series], float)
        slope, intercept = np.polyfit(ms, ns, 1)
        residual = float(np.max(np.abs(intercept + slope * ms - ns))) if len(series) > 2 else 0.0
        fit = {"a": float(intercept), "b": float(slope), "max_residual": residual}
        print(f"  fit: ≈ {intercept:.1f} + {slope:.1f}·M requests (largest residual {residual:.1f})")
    if rounds:
        timed = rounds[0]
        per_round_timed = timed["requests"]["per_round"]
        print(
            f"  the timed round (M = {timed['m']}, {timed['mb']:g} MB): {sum(per_round_timed.values()):.0f} requests "
            f"({fmt_counts(per_round_timed)})"
        )

    print(f"\n== idle requests per second (real gm.Session learners, the shipped defaults, not stepping, {args.idle_s:g} s) ==")
    for run in idle:
        per_learner = sum(run["per_learner_per_s"].values())
        leader = [n for n in run["nodes"] if n["leader"]]
        others = [n for n in run["nodes"] if not n["leader"]]
        print(
            f"  {run['learners']} learner(s): {sum(run['total_per_s'].values()):.1f}/s in all, {per_learner:.2f}/s per learner "
            f"({fmt_counts({op: round(n, 2) for op, n in run['per_learner_per_s'].items()})})"
        )
        if leader:
            print(f"    elected syncer node: {fmt_counts({op: round(n, 2) for op, n in leader[0]['per_s'].items()})}")
            print_purposes(leader[0]["per_s_by_purpose"])
        if others:
            mean = s3_requests.add(*(n["per_s"] for n in others), scale=1 / len(others))
            print(f"    each other node:     {fmt_counts({op: round(n, 2) for op, n in mean.items()})}")
            print_purposes(s3_requests.add(*(n["per_s_by_purpose"] for n in others), scale=1 / len(others)))

    worst_idles = [max(sum(run["per_learner_per_s"].values()) for run in runs) for runs in idle_runs]
    idle_verdict = verdict(
        f"idle requests ≤ {TARGET_IDLE_PER_S:g} per learner per second, the worst of {', '.join(map(str, idle_ks))} learners",
        worst_idles,
        at_most(TARGET_IDLE_PER_S),
    )
    if args.idle_only:  # no training measured: the idle verdict alone
        print(f"\n== targets ==\n  {idle_verdict.line('{:.2f}')}")
        given = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"args": given, "idle_runs": idle_runs, "targets": [idle_verdict.as_json()]}, indent=2))
        print(f"\nwrote {out}")
        return 0
    training = training_runs[-1]
    train_per_s = training["total_per_s"]
    train_total = sum(train_per_s.values())
    commits_per_min = training["commits"] / training["seconds"] * 60
    per_commit = train_total * training["seconds"] / training["commits"] if training["commits"] else float("inf")
    print(
        f"\n== {training['learners']} learners training, the shipped defaults, sync period {args.train_period_s:g} s "
        f"({training['step_s']:.3f} s steps × {SYNC_EVERY}), {training['seconds']:.0f} s =="
    )
    print(
        f"  {training['commits']} versions committed ({commits_per_min:.2f} a minute); {train_total:.2f} requests/s in all, "
        f"{train_total / training['learners']:.2f}/s per learner, {per_commit:.0f} per committed version"
    )
    print(f"  by operation, per learner: {fmt_counts({op: round(n, 2) for op, n in training['per_learner_per_s'].items()})}")
    train_day_requests = {op: n * DAY_S for op, n in train_per_s.items()}
    train_day = s3_requests.daily_cost(train_day_requests)

    idle_per_s = idle_at(idle, COST_LEARNERS)
    per_round_day = {op: n * ROUNDS_PER_DAY for op, n in per_round_timed.items()}
    idle_day = {op: n * DAY_S for op, n in idle_per_s.items()}
    cost_round = s3_requests.daily_cost(per_round_day)
    cost_idle = s3_requests.daily_cost(idle_day)
    cost_all = s3_requests.daily_cost(s3_requests.add(per_round_day, idle_day))
    print(
        f"\n== a day of {COST_LEARNERS} learners committing once a minute ({ROUNDS_PER_DAY} rounds, M = {timed['m']}, "
        f"{timed['mb']:g} MB fragment) =="
    )
    print(
        f"  prices: {s3_requests.PRICES_AS_OF}: PUT/COPY/POST/LIST $0.005 per 1,000; GET/HEAD and others $0.0004 "
        f"per 1,000; DELETE free"
    )
    # The training learners' fragment is small: their rounds cost what a 1 MB round does. A day of
    # the timed round's fragment replaces each of their rounds' requests with the timed round's.
    small = next((r["requests"]["per_round"] for r in counts if r["m"] == training["learners"]), None)
    train_big_day = with_timed_round(training, per_round_timed, small)
    for name, c in (
        ("measured", train_day),
        ("+ timed round", train_big_day),
        ("model: rounds", cost_round),
        ("model: idle", cost_idle),
        ("model: total", cost_all),
    ):
        print(
            f"  {name:<14} PUT-class {c['put_requests']:>11,.0f}  GET-class {c['get_requests']:>11,.0f}  "
            f"DELETE {c['delete_requests']:>9,.0f}   ${c['total_usd']:8.2f}/day"
        )
    measured_at = (training["learners"], args.train_period_s)
    at_target = measured_at == (COST_LEARNERS, ROUND_INTERVAL_S) and small is not None
    print(
        f"  measured: {training['learners']} learners training at a {args.train_period_s:g} s period (a 4 KB fragment), "
        f"a day of their requests{'' if at_target else ' (not the target setting: no verdict)'}; "
        f"+ timed round: the same with each of their rounds' requests replaced by the timed round's ({timed['mb']:g} MB, "
        "the verdict's figure); model: the timed round's requests per round and the idle learners' per second"
    )
    if COST_LEARNERS not in {run["learners"] for run in idle}:
        print(f"  (idle polling at {COST_LEARNERS} learners extrapolated from the measured counts, per learner never falling)")

    round_requests = sum(per_round_timed.values())
    days = [with_timed_round(t, per_round_timed, small)["total_usd"] for t in training_runs]
    cost_setting = DEFAULTS if at_target else f"{training['learners']} learners at a {args.train_period_s:g} s period"
    verdicts = [
        verdict(
            f"whole syncer round ≤ {TARGET_RATIO}× boto3 floor, {merge}",
            [r["ratio"] for r in rounds if r["merge"] == merge],
            at_most(TARGET_RATIO),
        )
        for merge in merges
        if rounds
    ]
    verdicts.append(idle_verdict)
    verdicts.append(
        verdict(
            f"{COST_LEARNERS} learners committing once a minute ≤ ${TARGET_USD_PER_DAY:g}/day at list prices "
            "(the timed round's fragment)",
            days,
            at_most(TARGET_USD_PER_DAY),
            setting=cost_setting,
        )
    )
    print("\n== targets ==")
    for v in verdicts:
        print(f"  {v.line('{:.2f}')}")
    print(
        f"  (information) requests per committed round grow with the contributions merged "
        f"({', '.join(f'M={m}: {n:.0f}' for m, n in series)}): {'yes' if grows else 'no' if grows is False else 'one M'}; "
        f"the timed round's own: {round_requests:.0f}"
    )

    result = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "s3_tuning": dataclasses.asdict(S3Tuning()),
        "rounds": rounds,
        "count_rounds": counts,
        "per_round_fit": fit,
        "idle": idle,
        "training": training,
        "cost": {
            "prices": s3_requests.PRICES_AS_OF,
            "usd_per_request": s3_requests.PRICES,
            "learners": COST_LEARNERS,
            "rounds_per_day": ROUNDS_PER_DAY,
            "idle_per_s": idle_per_s,
            "measured": train_day,
            "measured_with_timed_round": train_big_day,
            "per_round": cost_round,
            "idle_polling": cost_idle,
            "total": cost_all,
        },
        "idle_runs": idle_runs,
        "training_runs": training_runs,
        "requests_grow_with_m": grows,
        "targets": [v.as_json() for v in verdicts],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=float))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
