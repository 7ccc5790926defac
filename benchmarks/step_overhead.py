"""What a Session costs the training loop: idle ``step()``, goodput against the bare loop, and
publish-to-commit latency.

Three measurements, one run:

* **idle** — an empty loop against the same loop calling ``session.step()`` with nothing due
  (target ≤ 10 µs per step);
* **goodput** — a PyTorch model of ~16M parameters in 4 fragments trained on the CPU, the bare
  loop against the same loop inside a Session (directory mailbox, this node's syncer in the
  process, quorum 1) at H = 20 and H = 100, in ``--repeats`` interleaved pairs. The verdict
  takes the median of the pairs' measured wall ratios (targets: ≥ 0.98× at H = 20, ≥ 0.995× at
  H = 100); the ratio computed from the seconds the training thread spent inside
  ``session.step()`` (the exchange's own cost, without what its background threads take from
  shared cores) is printed as information only, and so is the wall ratio when a pair's session
  ran more than 5 % faster than its bare loop (the machine, not the session, set that pair);
* **latency** — publish-to-commit as the learner sees it: from handing a contribution to the
  background until the commit that merged it is ready to align (median and p90), measured in
  the goodput runs, and optionally with a second learner in another process
  (``--second-learner``).

The goodput runs also split the process's CPU seconds by thread (``benchmarks.cpu.ThreadCpu``)
and count the blob bytes each thread moves through the mailbox, so a **learner's CPU per sync**
(the training thread inside ``step()``, its exchange and lease threads) is set against its
reference measured in the same run: one copy plus one hash of the bytes the learner moved (its
contribution up, the commits it read down), target ≤ 1.5×; the hash is the run's blob digest
(BLAKE3, a new run's; ``gradientmail/digests.py``), and the same CPU against a copy plus a
sha256 (the reference before runs named BLAKE3) is printed beside it. The syncer's CPU per round (the
syncer, election, fetch and kernel threads; quorum 1, so a round per contribution) is printed
beside it against one copy plus one hash of the bytes the syncer moved. Both are also set against
the directory store's own floor, measured right after each session run beside its blobs: a hash
plus a plain write and fsync of a new file per byte written, a copy plus a hash per byte read
(on a VM that hands freed pages back to its host, a new file's page-cache pages are the dearest
part of a sync), and the learner's CPU outside the kernel (user seconds, the exchange's own code)
is printed against copy + hash too.

``--mailbox s3`` runs the session arm on a loopback SeaweedFS server started for the run (one
bucket prefix per session run) instead of a directory: a blob then goes to a socket, not into a new
file's page-cache pages, and the store's floor is plain boto3 (``put_object`` of a new object plus
the run's hash per byte written, ``get_object`` plus the hash per byte read), measured in this
process right after each session run. The server shares the machine's cores with the loop, as a
learner co-located with its bucket would; its own CPU is not the learner's and is not counted.

``--memory retained`` runs the whole process (bare loop and session alike) with
``gm.retain_freed_memory()`` applied first, as a ``gradientmail node`` runs; the default,
``returned``, is a user's own script that does not call it.

Run: ``python -m benchmarks.step_overhead [--quick] [--mailbox directory|s3] [--memory retained|returned]
[--json PATH]``; the JSON goes to ``runs/step-overhead-<UTC time>/result.json`` unless ``--json`` names another path.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gradientmail as gm
from benchmarks.cpu import ThreadCpu, add_memory_option, apply_memory_option, thread_group
from benchmarks.targets import DEFAULTS, MIN_RUNS, at_least, at_most, information, verdict
from gradientmail.digests import DEFAULT_BLOB_DIGEST, DigestName, hex_digest
from gradientmail.mailbox import ForwardingMailbox, Mailbox
from gradientmail.mailbox.base import Gathered
from testing.seaweed import Seaweed

IDLE_STEPS = 200_000
FRAGMENTS = 4
WIDTH = 2000
LAYERS = 4  # 4 × (2000² + 2000) ≈ 16.0M parameters
BATCH = 16
TARGETS = {20: 0.98, 100: 0.995}
IDLE_TARGET_US = 10.0
HASH: DigestName = DEFAULT_BLOB_DIGEST
"""The blob digest of the runs measured (a new run's): the hash in the sync CPU's reference."""
SYNC_CPU_TARGET = 1.5
"""A learner's CPU seconds per sync ÷ one copy plus one hash (the run's digest) of the bytes it moved (issue 44)."""
LEARNER_THREADS = ("MainThread", "gm-exchange", "gm-lease")
"""Thread families that are the learner's side of a session (MainThread: only its time in step())."""
SYNCER_THREADS = ("gm-syncer", "gm-election", "gm-fetch", "gm-kernel", "gm-commit")
FLOORS = {
    "directory": f"{HASH} + write + fsync of a new file per byte written, copy + {HASH} per byte read",
    "s3": f"plain boto3 put_object + {HASH} per byte written, get_object + {HASH} per byte read",
}
"""The store's own floor a sync's CPU is also set against, by ``--mailbox``."""
DISTURBED = 1.05
"""A pair whose session ran this much faster than its bare loop says the bare loop was slowed by
something else (a session only adds work): such a run gives no verdict."""


def per_step(loop: Callable[[int], None], steps: int) -> float:
    started = time.perf_counter()
    loop(steps)
    return (time.perf_counter() - started) / steps


def idle_overhead() -> dict[str, float]:
    model = {"w": np.zeros((64, 64), np.float32)}
    # nothing comes due during the measurement, and no syncer runs: nothing to publish at close either
    algorithm = gm.DiLoCo(sync_every=10**9, flush_on_close=False)
    options = gm.SessionOptions(run_syncer=False)
    with gm.Session(model, algorithm=algorithm, mailbox=gm.MemoryMailbox(), learner_id="bench", options=options) as session:

        def empty(steps: int) -> None:
            for _ in range(steps):
                pass

        def stepping(steps: int) -> None:
            for _ in range(steps):
                session.step(samples=32)

        bare = min(per_step(empty, IDLE_STEPS) for _ in range(3))
        with_session = min(per_step(stepping, IDLE_STEPS) for _ in range(3))
    return {"bare_us": bare * 1e6, "session_us": with_session * 1e6, "overhead_us": (with_session - bare) * 1e6}


# -- goodput ---------------------------------------------------------------------------


def build_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def trainer(model: torch.nn.Module) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)

    def train_step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    return train_step


def bare_run(steps: int) -> tuple[float, float]:
    """Seconds and CPU-seconds of ``steps`` training steps."""
    model = build_model()
    train_step = trainer(model)
    for _ in range(3):
        train_step()  # warm up allocator and kernels, as the session run does
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        train_step()
    return time.perf_counter() - started, time.process_time() - cpu


class BlobBytesByThread(ForwardingMailbox):
    """Counts the blob bytes each thread family reads (``get_hashed``) and writes (``put_hashed``):
    every tensor blob goes through them on the directory store; records are a few KB."""

    def __init__(self, inner: Mailbox) -> None:
        super().__init__(inner)
        self.read: dict[str, int] = {}
        self.written: dict[str, int] = {}
        self.writes: dict[str, int] = {}
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Count from here on (the run's creation writes every fragment's first version)."""
        with self._lock:
            self.read.clear()
            self.written.clear()
            self.writes.clear()

    def _count(self, into: dict[str, int], size: int) -> None:
        family = thread_group(threading.current_thread().name)
        with self._lock:
            into[family] = into.get(family, 0) + size

    def get_hashed(self, key: str, digest_name: DigestName, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        data, digest = self._forward_get_hashed(key, digest_name, max_bytes=max_bytes)  # the store's hashed read, or get + hash
        self._count(self.read, len(data))
        return data, digest

    def put_hashed(self, key: str, data: bytes | Gathered, digest: DigestName) -> tuple[str, str]:
        self._count(self.written, len(data))
        self._count(self.writes, 1)
        return self._forward_put_hashed(key, data, digest)


def fragment_bytes(model: torch.nn.Module) -> int:
    """Bytes of one fragment of the benchmark's model (its parameters split in FRAGMENTS)."""
    return sum(p.numel() * p.element_size() for p in model.parameters()) // FRAGMENTS


def copy_and_hash_s(size: int, digest: DigestName = HASH, repeats: int = 5) -> float:
    """CPU seconds of one copy (into a buffer already touched) plus one hash (``digest``) of
    ``size`` bytes: the reference a sync's CPU is set against, median of ``repeats``."""
    source = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    target = np.empty_like(source)
    target[:] = 0
    times = []
    for _ in range(repeats):
        started = time.thread_time()
        np.copyto(target, source)
        hex_digest(digest, source)
        times.append(time.thread_time() - started)
    return statistics.median(times)


def file_write_and_hash_s(size: int, directory: Path, repeats: int = 5) -> tuple[float, float]:
    """CPU seconds per byte of one hash (the run's) plus one plain ``write`` and ``fsync`` of ``size``
    bytes into a new file beside a run's blobs (kept until the last is written, as a run keeps its
    blobs), and of one copy plus one hash per byte read (reads come from the page cache): the least
    a blob costs the directory store on this machine at that moment, page-cache pages included,
    median of ``repeats``."""
    source = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
    directory.mkdir(parents=True, exist_ok=True)
    times, paths = [], [directory / f"floor-{i}" for i in range(repeats)]
    for path in paths:
        started = time.thread_time()
        hex_digest(HASH, source)
        with open(path, "wb", buffering=0) as stream:
            stream.write(memoryview(source))
            os.fsync(stream.fileno())
        times.append(time.thread_time() - started)
    for path in paths:
        path.unlink()
    return statistics.median(times) / size, copy_and_hash_s(size) / size


def s3_put_and_get_s(size: int, server: Seaweed, prefix: str, repeats: int = 5) -> tuple[float, float]:
    """CPU seconds per byte, in this thread, of plain boto3 writing ``size`` bytes as a new object
    (``put_object``) plus one hash (the run's), and of reading it back (``get_object``) plus one
    hash: the least a blob costs a learner on this S3 server, median of ``repeats``."""
    client = server.client()
    bucket = server.server.bucket
    body = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8).tobytes()
    puts, gets = [], []
    for i in range(repeats):
        key = f"{prefix}/floor-{i}"
        started = time.thread_time()
        hex_digest(HASH, body)
        client.put_object(Bucket=bucket, Key=key, Body=body)
        puts.append(time.thread_time() - started)
        started = time.thread_time()
        hex_digest(HASH, client.get_object(Bucket=bucket, Key=key)["Body"].read())
        gets.append(time.thread_time() - started)
        client.delete_object(Bucket=bucket, Key=key)
    return statistics.median(puts) / size, statistics.median(gets) / size


def session_run(steps: int, sync_every: int, root: Path, poll_interval_s: float, server: Seaweed | None) -> dict[str, Any]:
    """One session arm: a directory mailbox at ``root``, or (``server``) a fresh prefix on it."""
    model = build_model()
    train_step = trainer(model)
    for _ in range(3):
        train_step()
    algorithm = gm.DiLoCo(sync_every=sync_every, fragments=FRAGMENTS, quorum_size=1)
    options = gm.SessionOptions(poll_interval_s=poll_interval_s, lease_ttl_s=max(10.0, 3 * poll_interval_s))
    in_step: list[float] = []
    in_step_cpu = 0.0
    store: Mailbox = gm.FileMailbox(str(root)) if server is None else gm.open_mailbox(server.server.url(root.name))
    mailbox = BlobBytesByThread(store)
    with gm.Session(model, algorithm=algorithm, mailbox=mailbox, learner_id="learner-a", options=options) as session:
        mailbox.reset()
        with ThreadCpu() as threads:
            started, cpu, thread_cpu = time.perf_counter(), time.process_time(), time.thread_time()
            for _ in range(steps):
                train_step()
                t0, c0 = time.perf_counter(), time.thread_time()
                session.step(samples=BATCH)
                in_step_cpu += time.thread_time() - c0
                in_step.append(time.perf_counter() - t0)
            elapsed = time.perf_counter() - started
            cpu, thread_cpu = time.process_time() - cpu, time.thread_time() - thread_cpu
        latencies = session.publish_to_commit_s
        contributions, alignments = session.stats.contributions, session.stats.alignments
    fragment = fragment_bytes(model)
    if server is None:  # beside the run's blobs, still there
        write_floor, read_floor = file_write_and_hash_s(fragment, root / "floor")
    else:
        write_floor, read_floor = s3_put_and_get_s(fragment, server, f"{root.name}-floor")
    groups = threads.by_group()
    groups["MainThread"] = in_step_cpu  # the training thread's share: its time inside step()
    system = threads.system_by_group()
    read, written = dict(mailbox.read), dict(mailbox.written)
    return {
        "threads_cpu_s": groups,
        "missed_cpu_s": threads.missed_s,
        "blob_bytes_read": read,
        "blob_bytes_written": written,
        "learner_cpu_s": sum(groups.get(name, 0.0) for name in LEARNER_THREADS),
        "learner_system_s": sum(system.get(name, 0.0) for name in LEARNER_THREADS if name != "MainThread"),
        "syncer_system_s": sum(system.get(name, 0.0) for name in SYNCER_THREADS),
        "learner_read": sum(read.get(name, 0) for name in LEARNER_THREADS),
        "learner_written": sum(written.get(name, 0) for name in LEARNER_THREADS),
        "uploads": mailbox.writes.get("gm-exchange", 0),
        "floor_write_s_per_byte": write_floor,
        "floor_read_s_per_byte": read_floor,
        "syncer_cpu_s": sum(groups.get(name, 0.0) for name in SYNCER_THREADS),
        "syncer_read": sum(read.get(name, 0) for name in SYNCER_THREADS),
        "syncer_written": sum(written.get(name, 0) for name in SYNCER_THREADS),
        "elapsed_s": elapsed,
        "cpu_s": cpu,
        "background_cpu_s": cpu - thread_cpu,
        "in_step_s": sum(in_step),
        "in_step_max_ms": max(in_step) * 1e3,
        "in_step_exchanging_ms": [round(t * 1e3, 3) for t in sorted(in_step)[-5:]],
        "contributions": contributions,
        "alignments": alignments,
        "latencies_s": latencies,
    }


def quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p90": None, "n": 0}
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {"median": statistics.median(ordered), "p90": p90, "n": len(ordered)}


def goodput(sync_every: int, steps: int, repeats: int, poll_interval_s: float, server: Seaweed | None) -> dict[str, Any]:
    bares, sessions = [], []
    with tempfile.TemporaryDirectory(prefix="gm-step-overhead-") as tmp:
        for attempt in range(repeats):  # interleaved: drift on a shared machine hits both arms
            bares.append(bare_run(steps))
            place = Path(tmp) / f"h{sync_every}-{attempt}"
            sessions.append(session_run(steps, sync_every, place, poll_interval_s, server))
    # the reference, in the same process after the runs
    fragment = fragment_bytes(build_model())
    copy_s_per_byte = copy_and_hash_s(fragment) / fragment
    copy_sha256_s_per_byte = copy_and_hash_s(fragment, "sha256") / fragment
    syncs = [sync_cpu(s, copy_s_per_byte, copy_sha256_s_per_byte) for s in sessions]
    best_bare = min(b for b, _ in bares)
    best = min(sessions, key=lambda s: s["elapsed_s"])
    step_s = best_bare / steps
    in_step = min(s["in_step_s"] for s in sessions)
    latencies = [t for s in sessions for t in s["latencies_s"]]
    return {
        "sync_every": sync_every,
        "steps": steps,
        "bare_step_ms": step_s * 1e3,
        "session_step_ms": best["elapsed_s"] / steps * 1e3,
        "ratio": best_bare / best["elapsed_s"],
        "ratios_paired": [b / s["elapsed_s"] for (b, _), s in zip(bares, sessions, strict=True)],
        "extra_cpu_s": statistics.median(s["cpu_s"] - c for (_, c), s in zip(bares, sessions, strict=True)),
        "background_cpu_s": min(s["background_cpu_s"] for s in sessions),
        "training_thread_ratio": best_bare / (best_bare + in_step),
        "in_step_s": in_step,
        "in_step_max_ms": min(s["in_step_max_ms"] for s in sessions),
        "contributions": best["contributions"],
        "alignments": best["alignments"],
        "latency_s": quantiles(latencies),
        "copy_and_hash_gb_s": 1e-9 / copy_s_per_byte,
        "hash": HASH,
        "copy_and_sha256_gb_s": 1e-9 / copy_sha256_s_per_byte,
        "learner_sha256_ratios": [s["learner"]["sha256_ratio"] for s in syncs],
        "sync_cpu": syncs,
        "learner_sync_ratios": [s["learner"]["ratio"] for s in syncs],
        "learner_store_floor_ratios": [s["learner"]["store_floor_ratio"] for s in syncs],
        "learner_user_ratios": [s["learner"]["user_ratio"] for s in syncs],
        "syncer_round_ratios": [s["syncer"]["ratio"] for s in syncs],
        "syncer_store_floor_ratios": [s["syncer"]["store_floor_ratio"] for s in syncs],
    }


def sync_cpu(run: dict[str, Any], copy_s_per_byte: float, copy_sha256_s_per_byte: float) -> dict[str, Any]:
    """One session run's CPU per sync (learner) and per round (syncer; quorum 1, a round per
    contribution), each ÷ one copy plus one hash of the run's digest (``copy_s_per_byte``) of the
    bytes that side read and wrote, and ÷ a copy plus a sha256 (``copy_sha256_s_per_byte``). A
    sync is one contribution the exchange uploaded during the timed loop."""
    syncs = max(1, run["uploads"])
    figures: dict[str, Any] = {}
    for side in ("learner", "syncer"):
        cpu, read, written = run[f"{side}_cpu_s"], run[f"{side}_read"], run[f"{side}_written"]
        reference = copy_s_per_byte * (read + written)
        store_floor = run["floor_read_s_per_byte"] * read + run["floor_write_s_per_byte"] * written
        figures[side] = {
            "cpu_ms": cpu / syncs * 1e3,
            "system_ms": run[f"{side}_system_s"] / syncs * 1e3,
            "read_mb": read / syncs / 1e6,
            "written_mb": written / syncs / 1e6,
            "reference_ms": reference / syncs * 1e3,
            "ratio": cpu / max(reference, 1e-12),
            "sha256_ratio": cpu / max(copy_sha256_s_per_byte * (read + written), 1e-12),
            "user_ratio": (cpu - run[f"{side}_system_s"]) / max(reference, 1e-12),
            "store_floor_ms": store_floor / syncs * 1e3,
            "store_floor_ratio": cpu / max(store_floor, 1e-12),
        }
    figures["store_floor_write_gb_s"] = 1e-9 / run["floor_write_s_per_byte"]
    figures["store_floor_read_gb_s"] = 1e-9 / run["floor_read_s_per_byte"]
    figures["threads_cpu_ms"] = {name: cpu / syncs * 1e3 for name, cpu in run["threads_cpu_s"].items()}
    figures["missed_cpu_ms"] = run["missed_cpu_s"] / syncs * 1e3
    return figures


# -- latency with a small model: the exchange's structure, not its CPU ----------------------


def blocking_sync(steps: int, poll_interval_s: float, overlap_steps: int | None) -> dict[str, Any]:
    """A 64k-parameter NumPy model in 4 fragments, 10 ms steps, H = 20, quorum 1, the syncer in
    the process: with ``overlap_steps=0`` the time ``step()`` blocks at each sync, else the
    publish-to-commit latency the exchange records. Payloads are small, so what is left is
    polling, wake-ups and round trips."""
    model = small_model()
    algorithm = gm.DiLoCo(sync_every=20, fragments=FRAGMENTS, quorum_size=1, overlap_steps=overlap_steps)
    options = gm.SessionOptions(poll_interval_s=poll_interval_s, lease_ttl_s=max(10.0, 3 * poll_interval_s))
    blocked: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gm-step-overhead-lat-") as tmp:
        mailbox = gm.FileMailbox(str(Path(tmp) / "run"))
        with gm.Session(model, algorithm=algorithm, mailbox=mailbox, learner_id="learner-a", options=options) as session:
            for _ in range(steps):
                for value in model.values():
                    value -= 1e-3
                time.sleep(0.01)
                before, t0 = session.stats.contributions, time.perf_counter()
                session.step(samples=1)
                if session.stats.contributions > before:
                    blocked.append(time.perf_counter() - t0)
            latencies = session.publish_to_commit_s
    return {"blocked_s": quantiles(blocked), "publish_to_commit_s": quantiles(latencies)}


# -- a second learner in another process ---------------------------------------------


def small_model() -> dict[str, np.ndarray]:
    return {f"w{i}": np.zeros(16_384, np.float32) for i in range(4)}


def small_learner(
    root: str, learner: str, steps: int, poll_interval_s: float, run_syncer: bool, until: Callable[[], bool] | None = None
) -> list[float]:
    """A small-model learner (10 ms steps, H = 20) for ``steps`` steps, or until ``until()``;
    returns its publish-to-commit latencies."""
    model = small_model()
    algorithm = gm.DiLoCo(sync_every=20, fragments=FRAGMENTS, quorum_size=1)
    options = gm.SessionOptions(
        poll_interval_s=poll_interval_s, lease_ttl_s=max(10.0, 3 * poll_interval_s), run_syncer=run_syncer
    )
    with gm.Session(model, algorithm=algorithm, mailbox=gm.FileMailbox(root), learner_id=learner, options=options) as session:
        step = 0
        while (step < steps) if until is None else not until():
            step += 1
            for value in model.values():
                value -= 1e-3
            time.sleep(0.01)
            session.step(samples=1)
        return session.publish_to_commit_s


def _second_learner(root: str, steps: int, poll_interval_s: float, out: Any) -> None:
    out.put(small_learner(root, "learner-b", steps, poll_interval_s, run_syncer=False))


def two_learners(steps: int, poll_interval_s: float) -> dict[str, Any]:
    """Learner A (with the syncer) here, learner B (no syncer) in another process: B's latency
    crosses processes, so it includes the syncer's polling."""
    with tempfile.TemporaryDirectory(prefix="gm-step-overhead-2-") as tmp:
        root = str(Path(tmp) / "run")
        small_learner(root, "learner-a", 1, poll_interval_s, run_syncer=False)  # creates the run
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        other = ctx.Process(target=_second_learner, args=(root, steps, poll_interval_s, out))
        other.start()
        started = time.monotonic()
        # A hosts the syncer and trains until B is done (B's start-up in a fresh interpreter is slow)
        here = small_learner(
            root, "learner-a", 0, poll_interval_s, True, until=lambda: not out.empty() or time.monotonic() - started > 300
        )
        theirs = out.get(timeout=600)
        other.join(timeout=60)
    return {"latency_s_with_syncer": quantiles(here), "latency_s_other_process": quantiles(theirs)}


# -- main ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="where the JSON result goes")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved bare/session pairs per H (the median pair decides)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the training loop")
    parser.add_argument("--poll-interval", type=float, default=0.2, help="SessionOptions.poll_interval_s")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (a smoke test)")
    parser.add_argument("--second-learner", action="store_true", help="also measure latency with a learner in another process")
    parser.add_argument("--latency-only", action="store_true", help="skip the goodput runs (idle and small-model latency)")
    parser.add_argument("--only", type=int, action="append", default=None, help="only this H (repeatable)")
    parser.add_argument(
        "--mailbox", choices=tuple(FLOORS), default="directory", help="the session arm's store (s3: a loopback SeaweedFS)"
    )
    add_memory_option(parser, default="returned")  # a user's own training script, unless it calls gm.retain_freed_memory()
    args = parser.parse_args(argv)
    retained = apply_memory_option(args.memory)  # before torch starts its threads
    torch.set_num_threads(args.threads)
    repeats = 1 if args.quick else args.repeats
    plan = {20: 60 if args.quick else 120, 100: 150 if args.quick else 300}
    if args.only:
        plan = {h: s for h, s in plan.items() if h in args.only}
    if args.latency_only:
        plan = {}
    result: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "torch_threads": args.threads, "python": sys.version.split()[0]},
        "model": {"parameters": sum(p.numel() for p in build_model().parameters()), "fragments": FRAGMENTS},
        "poll_interval_s": args.poll_interval,
        "mailbox": args.mailbox,
        "memory": {"setting": args.memory, "retained": retained},
    }
    idle_runs = [idle_overhead() for _ in range(MIN_RUNS)]
    idle = idle_runs[len(idle_runs) // 2]
    result["idle"] = idle
    result["idle_runs"] = idle_runs
    print(
        f"idle step()            {statistics.median(r['overhead_us'] for r in idle_runs):8.3f} µs over an empty loop, "
        f"median of {len(idle_runs)}  (target ≤ {IDLE_TARGET_US} µs)"
    )
    result["goodput"] = {}
    mailbox = args.mailbox
    with contextlib.ExitStack() as stack:
        server = None
        if mailbox == "s3" and plan:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gm-step-overhead-s3-")))
            server = Seaweed.start(scratch, bucket="gradientmail-step-overhead")
            stack.callback(server.stop)
            os.environ.update(server.server.env)
        for sync_every, steps in plan.items():
            result["goodput"][str(sync_every)] = goodput(sync_every, steps, repeats, args.poll_interval, server)
    for key, figures in result["goodput"].items():
        sync_every = int(key)
        lat = figures["latency_s"]
        print(
            f"H={sync_every:<4d} bare {figures['bare_step_ms']:7.2f} ms/step  session {figures['session_step_ms']:7.2f} ms/step  "
            f"ratio {figures['ratio']:.4f} (paired {', '.join(f'{r:.3f}' for r in figures['ratios_paired'])})  "
            f"training thread {figures['training_thread_ratio']:.4f} ({figures['in_step_s'] * 1e3:.1f} ms in step(), "
            f"max {figures['in_step_max_ms']:.2f} ms)"
        )
        print(
            f"        CPU-seconds over the bare loop (median of pairs) {figures['extra_cpu_s']:.2f} "
            f"(background threads {figures['background_cpu_s']:.2f})"
        )
        print(
            f"        reference: one copy + one {figures['hash']} at {figures['copy_and_hash_gb_s']:.2f} GB/s in this process "
            f"(+ sha256: {figures['copy_and_sha256_gb_s']:.2f} GB/s)"
        )
        for sync in figures["sync_cpu"]:
            sides = "; ".join(
                f"{side} {f['cpu_ms']:.0f} CPU-ms ({f['system_ms']:.0f} of it the kernel's; "
                f"read {f['read_mb']:.1f} MB, wrote {f['written_mb']:.1f} MB) "
                f"= {f['ratio']:.2f}x copy+{HASH} ({f['reference_ms']:.0f} ms; {f['sha256_ratio']:.2f}x copy+sha256), "
                f"{f['store_floor_ratio']:.2f}x the store's floor ({f['store_floor_ms']:.0f} ms)"
                for side, f in ((side, sync[side]) for side in ("learner", "syncer"))
            )
            threads = ", ".join(f"{name} {ms:.0f}" for name, ms in sync["threads_cpu_ms"].items() if ms >= 1)
            print(
                f"        per sync (the store's floor, {FLOORS[mailbox]}: "
                f"written at {sync['store_floor_write_gb_s']:.2f} GB/s, read at {sync['store_floor_read_gb_s']:.2f} GB/s):"
            )
            print(f"          {sides}; threads (CPU-ms) {threads}; unsampled {sync['missed_cpu_ms']:.0f}")
        if lat["n"]:
            print(f"        publish-to-commit median {lat['median'] * 1e3:.0f} ms  p90 {lat['p90'] * 1e3:.0f} ms  (n={lat['n']})")
    small = {
        "overlap_steps=0": blocking_sync(120 if args.quick else 300, args.poll_interval, 0),
        "overlap_steps=None": blocking_sync(120 if args.quick else 300, args.poll_interval, None),
    }
    result["small_model"] = small
    blocked, latency = small["overlap_steps=0"]["blocked_s"], small["overlap_steps=None"]["publish_to_commit_s"]
    if blocked["n"]:
        print(
            f"small model, overlap_steps=0: a sync blocks "
            f"median {blocked['median'] * 1e3:.1f} ms  p90 {blocked['p90'] * 1e3:.1f} ms"
        )
    if latency["n"]:
        print(f"small model, publish-to-commit median {latency['median'] * 1e3:.1f} ms  p90 {latency['p90'] * 1e3:.1f} ms")
    if args.second_learner:
        pair = two_learners(150 if args.quick else 400, args.poll_interval)
        result["two_learners"] = pair
        for label, key in (("with syncer", "latency_s_with_syncer"), ("other process", "latency_s_other_process")):
            lat = pair[key]
            if lat["n"]:
                print(
                    f"2 learners, {label:13s} publish-to-commit "
                    f"median {lat['median'] * 1e3:.0f} ms  p90 {lat['p90'] * 1e3:.0f} ms"
                )
    verdicts = [
        verdict(
            f"idle step() ≤ {IDLE_TARGET_US:g} µs over an empty loop",
            [r["overhead_us"] for r in idle_runs],
            at_most(IDLE_TARGET_US),
        )
    ]
    where = "" if mailbox == "directory" else f" ({mailbox})"
    for sync_every, target in TARGETS.items():
        figures = result["goodput"].get(str(sync_every))
        if figures is not None:  # the measured wall time decides; the training thread's ratio is computed
            fastest = max(figures["ratios_paired"])
            verdicts.append(
                verdict(
                    f"H={sync_every}{where} wall time ≥ {target:g}× the bare loop",
                    figures["ratios_paired"],
                    at_least(target),
                    detail=f"best pair {figures['ratio']:.4f}",
                    setting=DEFAULTS if fastest <= DISTURBED else f"a disturbed machine (a pair at {fastest:.2f}×)",
                )
            )
            verdicts.append(
                verdict(
                    f"H={sync_every}{where} learner CPU per sync ≤ {SYNC_CPU_TARGET:g}× one copy + one {HASH} of its bytes",
                    figures["learner_sync_ratios"],
                    at_most(SYNC_CPU_TARGET),
                    detail=f"copy+{HASH} at {figures['copy_and_hash_gb_s']:.2f} GB/s in this run",
                )
            )
            verdicts.append(
                information(
                    f"H={sync_every}{where} learner CPU per sync ÷ one copy + one sha256 of its bytes",
                    figures["learner_sha256_ratios"],
                    why=f"the reference before runs named BLAKE3 (copy+sha256 at {figures['copy_and_sha256_gb_s']:.2f} GB/s)",
                )
            )
            verdicts.append(
                information(
                    f"H={sync_every}{where} learner CPU per sync ÷ the store's floor ({FLOORS[mailbox]})",
                    figures["learner_store_floor_ratios"],
                    why="the store's own floor in the same run; the target is set against a copy",
                )
            )
            verdicts.append(
                information(
                    f"H={sync_every}{where} learner CPU per sync outside the kernel ÷ one copy + one {HASH} of its bytes",
                    figures["learner_user_ratios"],
                    why="the exchange's own code: on a directory the kernel's share is mostly the page cache's new pages",
                )
            )
            for floor, key in ((f"copy + {HASH}", "syncer_round_ratios"), ("the store's floor", "syncer_store_floor_ratios")):
                verdicts.append(
                    information(
                        f"H={sync_every}{where} syncer CPU per round ÷ {floor} of its bytes",
                        figures[key],
                        why="the syncer runs in this process; the learner's share is the target",
                    )
                )
            verdicts.append(
                information(
                    f"H={sync_every}{where} training thread (computed: bare ÷ (bare + time in step()))",
                    figures["training_thread_ratio"],
                    why="computed, not measured wall time",
                )
            )
    result["targets"] = [v.as_json() for v in verdicts]
    for v in verdicts:
        print(v.line("{:.4g}"))
    path = args.json or Path("runs") / f"step-overhead-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}" / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
