"""Side by side with torchft: the same DiLoCo workload through torchft's lock-step DiLoCo and GradientMail.

    python -m benchmarks.peer_torchft            # ~3 minutes on an idle 2-core machine; sets up torchft on first use
    python -m benchmarks.peer_torchft --setup    # only create runs/.venv-torchft (torchft 0.2.0)
    python -m benchmarks.peer_torchft --no-torchft --quick   # a smoke run without torchft

Six arms, each ``--learners`` learner processes (default 2; ``python -m benchmarks.peer_worker``)
with the same model (a 1.64M-parameter fp32 MLP), seeds, data, H and steps, one torch thread each,
their loops started together; every arm runs ``--repeats`` times, interleaved, and the figures are
medians:

1. bare loop: no exchange; the throughput reference (all learners at once, so that they share
   the cores as the learners of the other arms do);
2. sync: synchronous DiLoCo in one process (every replica in lock-step, the mean of their
   pseudo-gradients through the same outer Nesterov SGD): the quality reference torchft and
   GradientMail are measured against (every worker runs all replicas, so its loop time is
   no throughput figure);
3. ddp: data-parallel, ``DistributedDataParallel`` over gloo, every step's gradients all-reduced:
   the step-by-step reference a low-communication method is set against;
4. torchft: ``torchft.local_sgd.DiLoCo`` with a Manager per learner (a replica group of one),
   gloo, and ``torchft_lighthouse`` on loopback; outer SGD lr 0.7, momentum 0.9, Nesterov;
5. GradientMail on a directory mailbox (``file://``): ``gm.DiLoCo(sync_every=H)``, every other
   setting its default (quorum 1, RDA merge, carrying unmerged work, 0.2 s poll) unless
   ``--quorum``, ``--merge``, ``--overlap-steps``, ``--no-carry``, ``--max-staleness``,
   ``--grace-tau`` or ``--grace-max-s`` say otherwise (``--quorum 2 --overlap-steps 0 --merge
   weighted_mean`` is lock-step DiLoCo, what torchft runs);
6. the same on a loopback SeaweedFS (``testing/seaweed.py``; the server shares the cores).

Run inside a namespace whose loopback is one shaped pipe (``testing.shaped_link``), it names it
with ``--link-namespace`` so the S3 server's own internal hops are exempted from the pipe; on such
a thin link ``--ddp-steps`` and ``--torchft-steps`` shorten the peer-to-peer arms.

Per arm: throughput against the bare loop (the bare loop's seconds ÷ the arm's, the loops'
first to last step, mean of the learners, per repeat); the time the exchange holds the
training thread per sync (torchft: its optimizer post-step hook, where DiLoCo's quorum,
allreduce and outer step run; GradientMail: ``session.step()``); bytes each learner moves per
sync (torchft and ddp: gloo's ring allreduce, 2(n−1)/n × 4 bytes × parameters each way per
all-reduce, from the parameter count; GradientMail: counted at the mailbox, what every get and put of the
learner's process carried, its syncer's included, not HTTP framing); the held-out loss of the
final model; and the loop's CPU seconds per learner (and what the exchange adds to the bare loop's,
per sync), with the server's (the lighthouse or
SeaweedFS). torchft runs in this environment if it has torchft, else in its own,
runs/.venv-torchft, created on first use with torch pinned by constraints.txt (the same torch
as here), or under ``--torchft-python``.

Cores: with a core per learner besides one for the server, the server (SeaweedFS, the
lighthouse) runs alone on the highest core and the learners on the others, in every arm
(:func:`core_plan`); with fewer, nothing is pinned, and the table says which.

Writes ``runs/peer-torchft-<UTC time>/result.json`` (``--json``); prints a table and the
targets (``benchmarks/targets.py``: medians of ≥ 3 interleaved repeats, at GradientMail's
defaults): its final loss within 1 % of torchft's; its throughput ratio at least torchft's at
that quality (a faster run at a worse loss is not met); its exchange CPU per sync at most
torchft's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.cpu import process_cpu_s
from benchmarks.targets import DEFAULTS, Verdict, at_most, check, verdict

ROOT = Path(__file__).resolve().parent.parent
TORCHFT_VENV = ROOT / "runs" / ".venv-torchft"
TORCHFT_REQUIREMENT = "torchft==0.2.0"
LEARNERS = 2
"""Learner processes per arm (``--learners``)."""
ARMS = ("bare", "sync", "ddp", "torchft", "gm-directory", "gm-s3")
PEER_ARMS = ("ddp", "torchft")
"""The arms whose learners exchange peer to peer (gloo): ``--ddp-steps`` and ``--torchft-steps``
shorten them on a thin link, where their every exchange waits for the pipe; throughput is per step."""


@dataclass
class ArmResult:
    """One arm over every repeat; each figure is the median over repeats unless it says otherwise."""

    arm: str
    trials: list[dict[str, Any]] = field(default_factory=list)
    """Per repeat: the learners' own results, the loop seconds and the server's CPU seconds."""
    throughput_ratios: list[float] = field(default_factory=list)
    """Per repeat: that repeat's bare loop seconds ÷ this arm's loop seconds (means over learners)."""
    throughput_ratio: float = 0.0
    loop_s: float = 0.0
    blocked_ms_per_sync: float = 0.0
    """Time the exchange held the training thread over the loop, mean over learners, ÷ syncs."""
    bytes_up_per_sync: list[float] = field(default_factory=list)
    """Per learner, most first (GradientMail: the node that ran the syncer, then the other)."""
    bytes_down_per_sync: list[float] = field(default_factory=list)
    eval_loss: float = 0.0
    """Held-out loss of the run's final model (GradientMail: the learner that saw the newest commit), mean over repeats."""
    loop_cpu_s: float = 0.0
    """CPU seconds of one learner's process (every thread) over the loop, mean over learners."""
    server_cpu_s: float | None = None
    """CPU seconds of the lighthouse or the SeaweedFS server while the arm ran."""
    exchange_cpu_ms_per_sync_runs: list[float] = field(default_factory=list)
    """Per repeat: the exchange CPU per sync in ms (see ``exchange_cpu_ms_per_sync``)."""
    eval_losses: list[float] = field(default_factory=list)
    """Per repeat: the held-out loss ``eval_loss`` averages."""
    exchange_cpu_ms_per_sync: float | None = None
    """What the exchange costs a learner's cores: (this arm's loop CPU − the bare loop's, per
    repeat, mean over learners) ÷ syncs, in ms; every thread of the process counts (torchft's
    allreduce and Manager, GradientMail's transfers, hashing and syncer). None for the
    references (bare, sync)."""
    requests_per_sync: list[float] = field(default_factory=list)
    """GradientMail: mailbox requests per sync per learner (every kind: polls, leases, payloads), most first."""
    bytes_per_contribution: float | None = None
    """GradientMail: a learner's published pseudo-gradient bytes ÷ its contributions (median over
    repeats of the mean over learners): what one delta costs on the wire, whichever node ran the syncer."""
    period_need: float | None = None
    """GradientMail: what a sync period's transfers needed ÷ the period, the busiest learner's at
    the end of its loop (``session.transfer_meter``), median over repeats; over 1: the link could
    not carry a round a period."""
    link_hints: list[str] = field(default_factory=list)
    """GradientMail: the lines ``gradientmail status`` would print for its link-bound learners (last repeat)."""
    align_lag_steps: float | None = None
    """GradientMail: median steps from publishing a round (step v × H) to training on its commit."""


def _period_need(learners: list[dict[str, Any]]) -> float | None:
    """The busiest learner's share of a sync period its transfers needed (None: no reading)."""
    from gradientmail.session.transfer_meter import LinkReading

    readings = [LinkReading.from_info(r.get("link")) for r in learners]
    shares = [reading.busy_share for reading in readings if reading is not None]
    return max(shares) if shares else None


# -- set-up ------------------------------------------------------------------------------------


def torchft_python(explicit: str | None, setup: bool) -> str | None:
    """An interpreter that imports torchft: ``explicit``, else this one if it has torchft, else
    runs/.venv-torchft (made if missing and ``setup``)."""
    if explicit:
        return explicit
    if importlib.util.find_spec("torchft") is not None:
        return sys.executable
    python = TORCHFT_VENV / "bin" / "python"
    stamp = TORCHFT_VENV / ".torchft-installed"
    wanted = f"{TORCHFT_REQUIREMENT}\n{(ROOT / 'constraints.txt').read_text()}"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(python)
    if not setup:
        return None
    print(f"setting up {TORCHFT_VENV.relative_to(ROOT)} ({TORCHFT_REQUIREMENT}, torch from constraints.txt)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(TORCHFT_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-c", str(ROOT / "constraints.txt"), "torch", TORCHFT_REQUIREMENT, "numpy"], check=True)
    stamp.write_text(wanted)
    return str(python)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- cores -------------------------------------------------------------------------------------


def core_plan(cpus: set[int], learners: int) -> tuple[set[int], set[int]] | None:
    """The server's core and the learners' cores, where the machine allows it: with at least one
    core per learner besides the server's, the server (SeaweedFS or the lighthouse, whichever
    the arm has) gets the highest core to itself and the learners the rest, in every arm, so
    no arm's learners compete with a server for their cores and none is favoured. None with
    fewer cores: nothing is pinned (this 2-core machine)."""
    if len(cpus) < learners + 1:
        return None
    server = max(cpus)
    return {server}, cpus - {server}


def pin_process(pid: int, cores: set[int]) -> None:
    """Every thread of a running process onto ``cores`` (a thread's affinity is its own, so the
    server's threads started before this are moved one by one; later ones inherit)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.sched_setaffinity(int(task.name), cores)


def machine_plan(learners: int) -> tuple[set[int], set[int]] | None:
    return core_plan(set(os.sched_getaffinity(0)), learners) if hasattr(os, "sched_getaffinity") else None


PLAN = machine_plan(LEARNERS)
"""This machine's plan for this run's learners (None: nothing pinned; ``main`` sets it for
``--learners``); printed with the table and kept in result.json."""


def _pin_learner() -> None:  # in the learner's process, before exec: every thread it starts inherits
    if PLAN is not None:
        os.sched_setaffinity(0, PLAN[1])


# -- running one arm ---------------------------------------------------------------------------


def run_learners(
    workdir: Path, python: str, arm_args: list[str], common: list[str], env: dict[str, str], timeout_s: float, learners: int
) -> list[dict[str, Any]]:
    """Start ``learners`` workers, release them together once all are set up, return their results."""
    workdir.mkdir(parents=True, exist_ok=True)
    go = workdir / "go"
    processes = []
    for rank in range(learners):
        command = [python, "-m", "benchmarks.peer_worker", *arm_args, *common, "--rank", str(rank)]
        command += ["--ready", str(workdir / f"ready-{rank}"), "--go", str(go), "--out", str(workdir / f"learner-{rank}.json")]
        log = (workdir / f"learner-{rank}.log").open("w")
        path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(ROOT)]
        worker_env = {**os.environ, **env, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(path)}
        processes.append(
            subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=worker_env, preexec_fn=_pin_learner)
        )
        log.close()
    try:
        deadline = time.monotonic() + timeout_s
        while not all((workdir / f"ready-{rank}").exists() for rank in range(learners)):
            for rank, process in enumerate(processes):
                if process.poll() is not None:
                    raise RuntimeError(
                        f"learner {rank} exited with {process.returncode}:\n{_tail(workdir / f'learner-{rank}.log')}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"learners not ready after {timeout_s} s")
            time.sleep(0.01)
        go.write_text("go")
        for rank, process in enumerate(processes):
            code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(f"learner {rank} exited with {code}:\n{_tail(workdir / f'learner-{rank}.log')}")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [json.loads((workdir / f"learner-{rank}.json").read_text()) for rank in range(learners)]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def summarise(arm: str, trials: list[dict[str, Any]], bare: ArmResult | None) -> ArmResult:
    result = ArmResult(arm=arm, trials=trials)
    loops = [t["loop_s"] for t in trials]
    result.loop_s = statistics.median(loops)
    if bare is not None:  # per step: the peer-to-peer arms may run fewer (--peer-steps)
        result.throughput_ratios = [
            (b["loop_s"] / _steps(b)) / (t["loop_s"] / _steps(t)) for b, t in zip(bare.trials, trials, strict=False)
        ]
    else:
        result.throughput_ratios = [1.0 for _ in loops]
    result.throughput_ratio = statistics.median(result.throughput_ratios)
    syncs = max(1, trials[0]["learners"][0]["syncs"])
    result.blocked_ms_per_sync = (
        statistics.median(statistics.mean(r["blocked_s"] for r in t["learners"]) for t in trials) * 1e3 / syncs
    )
    result.loop_cpu_s = statistics.median(statistics.mean(r["loop_cpu_s"] for r in t["learners"]) for t in trials)
    if bare is not None and arm not in ("bare", "sync"):
        extra = [
            statistics.mean(r["loop_cpu_s"] for r in t["learners"]) - statistics.mean(r["loop_cpu_s"] for r in b["learners"])
            for b, t in zip(bare.trials, trials, strict=False)
        ]
        result.exchange_cpu_ms_per_sync_runs = [e * 1e3 / syncs for e in extra]
        result.exchange_cpu_ms_per_sync = statistics.median(extra) * 1e3 / syncs
    if arm != "bare":
        ups = [sorted((r["bytes_up"] / syncs for r in t["learners"]), reverse=True) for t in trials]
        downs = [sorted((r["bytes_down"] / syncs for r in t["learners"]), reverse=True) for t in trials]
        result.bytes_up_per_sync = [statistics.median(column) for column in zip(*ups, strict=True)]
        result.bytes_down_per_sync = [statistics.median(column) for column in zip(*downs, strict=True)]
    if arm.startswith("gm"):
        requests = [sorted((r["mailbox_requests"] / syncs for r in t["learners"]), reverse=True) for t in trials]
        result.requests_per_sync = [statistics.median(column) for column in zip(*requests, strict=True)]
        needs = [need for need in (_period_need(t["learners"]) for t in trials) if need is not None]
        result.period_need = statistics.median(needs) if needs else None
        result.link_hints = [r["link_hint"] for r in trials[-1]["learners"] if r.get("link_hint")]
        result.bytes_per_contribution = statistics.median(
            statistics.mean(r["bytes_published"] / max(1, r["contributions"]) for r in t["learners"]) for t in trials
        )
    losses = []
    for t in trials:
        newest = max(t["learners"], key=lambda r: (r.get("versions", {}).get("0", 0), -r["eval_loss"]))
        losses.append(newest["eval_loss"] if arm.startswith("gm") else statistics.mean(r["eval_loss"] for r in t["learners"]))
    result.eval_losses = losses
    result.eval_loss = statistics.mean(losses)
    servers = [t["server_cpu_s"] for t in trials if t["server_cpu_s"] is not None]
    result.server_cpu_s = statistics.median(servers) if servers else None
    lags = [lag for t in trials for r in t["learners"] for lag in r.get("align_lag_steps", [])]
    result.align_lag_steps = statistics.median(lags) if lags else None
    return result


def _steps(trial: dict[str, Any]) -> int:
    return int(trial["learners"][0]["steps"])


class Servers:
    """The SeaweedFS server, started on first use and shared by the repeats of the S3 arm. In a
    shaped link's namespace (``link_namespace``) its internal ports are exempted from the pipe:
    only what the learners move to and from S3 crosses it (``testing.shaped_link``)."""

    def __init__(self, workdir: Path, link_namespace: str | None = None) -> None:
        self._workdir = workdir
        self._link_namespace = link_namespace
        self._seaweed: Any = None

    def seaweed(self) -> Any:
        if self._seaweed is None:
            from testing.seaweed import Seaweed
            from testing.shaped_link import exempt_ports

            self._seaweed = Seaweed.start(self._workdir / "seaweed")
            if self._link_namespace is not None:
                exempt_ports(self._link_namespace, self._seaweed.internal_ports)
        return self._seaweed

    def stop(self) -> None:
        if self._seaweed is not None:
            self._seaweed.stop()
            self._seaweed = None


def run_trial(
    arm: str, repeat: int, args: argparse.Namespace, workdir: Path, common: list[str], tf_python: str | None, servers: Servers
) -> dict[str, Any]:
    """One arm once: its two learners, with the lighthouse or mailbox it needs."""
    python = sys.executable
    env: dict[str, str] = {}
    server_pid: int | None = None
    cleanup: list[Any] = []
    workdir = workdir / f"{arm}-{repeat}"
    workdir.mkdir(parents=True, exist_ok=True)
    gm_args = ["--poll", str(args.poll), "--quorum", str(args.quorum), "--merge", args.merge]
    if args.overlap_steps is not None:
        gm_args += ["--overlap-steps", str(args.overlap_steps)]
    if args.no_carry:
        gm_args += ["--no-carry"]
    if args.max_staleness:
        gm_args += ["--max-staleness", str(args.max_staleness)]
    if args.grace_max_s is not None:
        gm_args += ["--grace-max-s", str(args.grace_max_s)]
    if args.grace_tau is not None:
        gm_args += ["--grace-tau", str(args.grace_tau)]
    if args.knobs:
        gm_args += ["--knobs", args.knobs]
    peer_steps = {"ddp": args.ddp_steps, "torchft": args.torchft_steps}.get(arm)
    if peer_steps is not None:
        steps_at = common.index("--steps") + 1
        common = [*common[:steps_at], str(peer_steps), *common[steps_at + 1 :]]
    if arm == "bare":
        arm_args = ["--arm", "bare"]
    elif arm == "sync":
        arm_args = ["--arm", "sync"]
    elif arm == "torchft":
        assert tf_python is not None
        python = tf_python
        port = free_port()
        lighthouse_bin = Path(tf_python).parent / "torchft_lighthouse"
        command = [str(lighthouse_bin), "--bind", f"127.0.0.1:{port}", "--min_replicas", str(args.learners)]
        with (workdir / "lighthouse.log").open("w") as log:
            lighthouse = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        cleanup.append(lambda: (lighthouse.kill(), lighthouse.wait()))
        _wait_for_port(port, lighthouse)
        server_pid = lighthouse.pid
        arm_args = ["--arm", "torchft", "--lighthouse", f"http://127.0.0.1:{port}"]
    elif arm == "ddp":
        arm_args = ["--arm", "ddp", "--master-port", str(free_port())]
    elif arm == "gm-directory":
        arm_args = ["--arm", "gradientmail", "--mailbox", (workdir / "mailbox").as_uri(), *gm_args]
    else:
        seaweed = servers.seaweed()
        server_pid = seaweed.process.pid
        env = seaweed.server.env
        url = seaweed.server.url(f"peer-{repeat}-{int(time.time())}")
        arm_args = ["--arm", "gradientmail", "--mailbox", url, *gm_args]
    if server_pid and PLAN is not None:
        pin_process(server_pid, PLAN[0])
    try:
        cpu_before = process_cpu_s(server_pid) if server_pid else 0.0
        learners = run_learners(workdir, python, arm_args, common, env, args.timeout, args.learners)
        server_cpu = process_cpu_s(server_pid) - cpu_before if server_pid else None
    finally:
        for step in reversed(cleanup):
            step()
    loop_s = statistics.mean(r["loop_s"] for r in learners)
    return {"loop_s": loop_s, "server_cpu_s": server_cpu, "learners": learners}


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"torchft_lighthouse exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"torchft_lighthouse not listening on {port} after {timeout_s} s")


# -- report ------------------------------------------------------------------------------------


def _mb(values: list[float]) -> str:
    return "/".join(f"{v / 1e6:.1f}" for v in values) if values else "—"


def print_table(results: list[ArmResult], parameters: int, repeats: int, learners: int) -> None:
    print(
        f"\n{parameters:,} fp32 parameters ({4 * parameters / 1e6:.2f} MB), {learners} learners, medians of {repeats} repeat(s)"
    )
    if PLAN is None:
        print(f"cores: not pinned ({os.cpu_count()} cores: a server core needs at least {learners + 1})")
    else:
        print(f"cores: the server on {sorted(PLAN[0])}, the learners on {sorted(PLAN[1])}, in every arm")
    header = f"{'arm':<14}{'loop s':>8}{'× bare':>8}{'blocked ms/sync':>17}{'MB up/sync':>13}{'MB down/sync':>14}"
    header += f"{'eval loss':>11}{'CPU-s/learner':>15}{'exchange CPU ms/sync':>22}{'server CPU-s':>14}{'lag steps':>11}"
    print(header)
    print("-" * len(header))
    for r in results:
        server = f"{r.server_cpu_s:.1f}" if r.server_cpu_s is not None else "—"
        lag = f"{r.align_lag_steps:.0f}" if r.align_lag_steps is not None else "—"
        exchange = f"{r.exchange_cpu_ms_per_sync:.0f}" if r.exchange_cpu_ms_per_sync is not None else "—"
        print(
            f"{r.arm:<14}{r.loop_s:8.2f}{r.throughput_ratio:8.2f}{r.blocked_ms_per_sync:17.1f}"
            f"{_mb(r.bytes_up_per_sync):>13}{_mb(r.bytes_down_per_sync):>14}{r.eval_loss:11.3f}"
            f"{r.loop_cpu_s:15.2f}{exchange:>22}{server:>14}{lag:>11}"
        )
    print(
        "× bare: the bare loop's seconds ÷ the arm's, per repeat; MB per learner, most first (GradientMail: the node\n"
        "that ran the syncer, then the other), counted at the mailbox; torchft's from 2(n−1)/n × 4 B × parameters\n"
        "(gloo ring allreduce). exchange CPU: the arm's loop CPU less the bare loop's, per sync, every thread of\n"
        "the learner's process. lag steps: from a round's publish to training on its commit."
    )


GM_DEFAULTS = {
    "poll": 0.2,
    "quorum": 1,
    "merge": "rda",
    "overlap_steps": None,
    "no_carry": False,
    "max_staleness": 0,
    "grace_max_s": None,
    "grace_tau": None,
    "knobs": None,
}
"""GradientMail's settings as this benchmark's options spell them, at the shipped defaults."""


def gm_setting(args: argparse.Namespace) -> str:
    """``defaults``, or the GradientMail options that differ from them (a verdict needs the defaults)."""
    changed = [f"{name}={getattr(args, name)!r}" for name, value in GM_DEFAULTS.items() if getattr(args, name) != value]
    return ", ".join(changed) if changed else DEFAULTS


LOSS_TOLERANCE = 1.01
"""Throughput counts only at equal quality: GradientMail's final loss within 1 % of torchft's."""


def verdicts(results: dict[str, ArmResult], setting: str) -> list[Verdict]:
    """The targets against torchft, per repeat (interleaved, so each repeat compares arms that
    ran side by side in time), judged on the medians: equal quality first, then throughput at
    that quality, then the exchange's CPU per sync (issue "Speed round 2")."""
    s3, tf = results.get("gm-s3"), results.get("torchft")
    names = (
        f"GradientMail on S3: final loss ≤ {LOSS_TOLERANCE:g}× torchft's",
        "GradientMail on S3: throughput ratio ≥ torchft's, at that quality",
        "GradientMail on S3: exchange CPU per sync ≤ torchft's (ms more than torchft)",
    )
    if s3 is None or tf is None:
        return [check(name, None, detail="the gm-s3 or the torchft arm did not run") for name in names]
    losses = [g / t for g, t in zip(s3.eval_losses, tf.eval_losses, strict=False)]
    quality = verdict(names[0], losses, at_most(LOSS_TOLERANCE), setting=setting)
    speeds = [g / t for g, t in zip(s3.throughput_ratios, tf.throughput_ratios, strict=False)]
    speed = verdict(
        names[1],
        speeds,
        lambda ratio: ratio >= 1.0 and quality.met is True,  # throughput counts only at equal quality
        setting=setting,
        detail=f"{s3.throughput_ratio:.2f}× bare against torchft's {tf.throughput_ratio:.2f}×"
        + ("" if quality.met is not False else "; at unequal quality, so not met"),
    )
    cpu = verdict(
        names[2],
        [g - t for g, t in zip(s3.exchange_cpu_ms_per_sync_runs, tf.exchange_cpu_ms_per_sync_runs, strict=False)],
        at_most(0.0),
        setting=setting,
        detail=f"{s3.exchange_cpu_ms_per_sync or 0:.0f} ms against {tf.exchange_cpu_ms_per_sync or 0:.0f} ms",
    )
    return [quality, speed, cpu]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sync-every", type=int, default=20, help="H, for both systems")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024, help="MLP width: 1024 is 1.64M parameters")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every arm, interleaved; figures are medians")
    parser.add_argument("--learners", type=int, default=LEARNERS, help="learner processes per arm")
    parser.add_argument(
        "--ddp-steps", type=int, default=None, help="steps of the ddp arm (default: --steps; throughput is per step)"
    )
    parser.add_argument(
        "--torchft-steps", type=int, default=None, help="steps of the torchft arm (default: --steps; throughput is per step)"
    )
    parser.add_argument(
        "--link-namespace",
        default=None,
        help="the shaped link this run is inside (testing.shaped_link): the S3 server's internal ports bypass its pipe",
    )
    parser.add_argument("--poll", type=float, default=0.2, help="GradientMail's poll interval (s; its default: 0.2)")
    parser.add_argument("--quorum", type=int, default=1, help="GradientMail's quorum_size (its default: 1)")
    parser.add_argument("--merge", choices=["rda", "weighted_mean"], default="rda", help="GradientMail's merge (default: rda)")
    parser.add_argument("--overlap-steps", type=int, default=None, help="GradientMail's overlap_steps (default: None)")
    parser.add_argument("--no-carry", action="store_true", help="GradientMail: carry_unmerged=False")
    parser.add_argument("--max-staleness", type=int, default=0, help="GradientMail's max_staleness (default: 0)")
    parser.add_argument("--grace-max-s", type=float, default=None, help="GradientMail's grace_max_s (default: 60)")
    parser.add_argument("--grace-tau", type=float, default=None, help="GradientMail's grace_tau (default: 4)")
    parser.add_argument("--knobs", default=None, help="more gm.DiLoCo fields for GradientMail, as JSON")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)} (bare always runs)")
    parser.add_argument("--no-torchft", action="store_true", help="skip the torchft arm (and its set-up)")
    parser.add_argument("--setup", action="store_true", help="create runs/.venv-torchft and exit")
    parser.add_argument("--torchft-python", default=None, help="an interpreter with torchft, instead of runs/.venv-torchft")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 40 steps, H = 10, a narrow MLP, one repeat")
    parser.add_argument("--timeout", type=float, default=300.0, help="per arm and repeat (s)")
    parser.add_argument("--json", default=None, help="default: runs/peer-torchft-<UTC time>/result.json")
    parser.add_argument("--keep", action="store_true", help="keep the learners' logs, mailboxes and server data")
    args = parser.parse_args(argv)
    if args.setup:
        print(torchft_python(args.torchft_python, setup=True))
        return 0
    if args.quick:
        args.steps, args.sync_every, args.hidden, args.repeats = 40, 10, 128, 1
    if args.learners < 2:
        parser.error("--learners must be at least 2: the arms exchange between learners")
    global PLAN
    PLAN = machine_plan(args.learners)
    arms = [a for a in args.arms.split(",") if a and not (args.no_torchft and a == "torchft")]
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
    arms = [a for a in ARMS if a in arms or a == "bare"]
    tf_python = torchft_python(args.torchft_python, setup=True) if "torchft" in arms else None

    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(args.json).resolve() if args.json else ROOT / "runs" / f"peer-torchft-{stamp}" / "result.json"
    workdir = out.parent / "work"
    shutil.rmtree(workdir, ignore_errors=True)  # a kept mailbox of an earlier run would be joined, not started afresh
    workdir.mkdir(parents=True, exist_ok=True)
    common = ["--steps", str(args.steps), "--sync-every", str(args.sync_every), "--batch", str(args.batch)]
    common += ["--hidden", str(args.hidden), "--learners", str(args.learners)]
    print(
        f"steps {args.steps}, H {args.sync_every}, batch {args.batch}, {args.learners} learners, {args.repeats} repeat(s)",
        flush=True,
    )
    trials: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    servers = Servers(workdir, args.link_namespace)
    try:
        for repeat in range(args.repeats):
            # bare first in every repeat, the others rotated so that no arm always follows the same one
            others = arms[1:]
            shift = repeat % len(others) if others else 0
            for arm in ["bare", *others[shift:], *others[:shift]]:
                started = time.monotonic()
                trial = run_trial(arm, repeat, args, workdir, common, tf_python, servers)
                trials[arm].append(trial)
                took = time.monotonic() - started
                print(f"repeat {repeat + 1}: {arm:<13} loop {trial['loop_s']:6.2f} s ({took:5.1f} s in all)", flush=True)
    finally:
        servers.stop()
    bare = summarise("bare", trials["bare"], None)
    results = {"bare": bare, **{arm: summarise(arm, trials[arm], bare) for arm in arms[1:]}}
    parameters = trials["bare"][0]["learners"][0]["parameters"]
    print_table(list(results.values()), parameters, args.repeats, args.learners)
    judged_at = gm_setting(args)
    targets = verdicts(results, judged_at)
    print()
    for v in targets:
        print(v.line("{:.3g}"))
    for arm in results.values():
        for trial in arm.trials:
            for learner in trial["learners"]:
                learner.pop("losses", None)
    payload = {
        "settings": {
            "steps": args.steps,
            "sync_every": args.sync_every,
            "batch": args.batch,
            "hidden": args.hidden,
            "parameters": parameters,
            "learners": args.learners,
            "repeats": args.repeats,
            "gradientmail": {
                "poll_s": args.poll,
                "quorum_size": args.quorum,
                "merge": args.merge,
                "overlap_steps": args.overlap_steps,
                "carry_unmerged": not args.no_carry,
                "max_staleness": args.max_staleness,
                "grace_max_s": args.grace_max_s,
                "grace_tau": args.grace_tau,
                "knobs": json.loads(args.knobs) if args.knobs else {},
            },
            "torchft": TORCHFT_REQUIREMENT if "torchft" in results else None,
            "torch": trials["bare"][0]["learners"][0]["torch_version"],
            "cpus": os.cpu_count(),
            "pinned": None if PLAN is None else {"server": sorted(PLAN[0]), "learners": sorted(PLAN[1])},
        },
        "arms": {arm: asdict(r) for arm, r in results.items()},
        "targets": [v.as_json() for v in targets],
        "torchft_bytes_formula": "per sync and learner, each way: 2(n−1)/n × 4 bytes × parameters (gloo ring allreduce)",
    }
    out.write_text(json.dumps(payload, indent=2))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
