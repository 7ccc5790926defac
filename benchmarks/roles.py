"""Roles: a run whose rounds a dedicated syncer closes, against the same learners closing them.

    python -m benchmarks.roles                 # 2 learners, 300 steps, 3 repeats (~15 minutes on 2 cores)
    python -m benchmarks.roles --steps 60 --repeats 1
    python -m benchmarks.roles --takeover-only     # the three takeovers alone (~4 minutes)

Every arm trains the demo GPT on Shakespeare with two learner processes (``demo.worker``, the
quality benchmark's settings: one fragment, H = 50) on a directory mailbox, and is scored by the
held-out loss of the model the run ends with:

* ``both`` (the reference): two ``both`` nodes; one of them is elected and closes the rounds;
* ``learners + syncer``: two ``learner`` nodes and a dedicated syncer, ``gradientmail node``
  with ``GRADIENTMAIL_ROLE=syncer``, which closes every round;
* ``either + both``: an ``either`` node and a ``both`` node; when the either node is elected it
  stops training while the other trains, so the two learners train one after the other: a
  different run, reported (who was elected, rounds, wall time, loss) but not judged against
  ``both``.

The dedicated syncer's target is one-sided: its run commits as the ``both`` run does (every step
merged) and ends no worse than it beyond the run-to-run noise (the larger of the two arms'
spreads over repeats).

Then the takeover, once per repeat: two ``both`` nodes and a dedicated syncer; once the syncer
has committed, it is killed with SIGKILL and the time until a training node holds the syncer
lease is measured against its bound, the lease TTL plus the store's stamp resolution (a
directory's 10 ms) plus a poll (INV-6), from the kill (its last renewal came before).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gradientmail as gm
from benchmarks.arms import ROOT, Arm, gradientmail_arm
from benchmarks.targets import MIN_RUNS, check, within_noise
from gradientmail.mailbox.directory import MTIME_RESOLUTION_S
from gradientmail.store import RunStore

ARMS = {
    "both": [[], []],
    "learners + syncer": [["--role", "learner"], ["--role", "learner"]],
    "either + both": [["--role", "either"], []],
}
"""Each arm's extra ``demo.worker`` arguments, per learner."""


def dedicated_syncer(url: str, log: Path) -> subprocess.Popen[str]:
    """``gradientmail node`` as the run's dedicated syncer, configured as a user would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADIENTMAIL_")}
    env |= {"GRADIENTMAIL_MAILBOX": url, "GRADIENTMAIL_ROLE": "syncer", "GRADIENTMAIL_LEARNER_ID": "cpu-sync"}
    handle = log.open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "gradientmail.cli", "node"], cwd=ROOT, env=env, stdout=handle, stderr=handle, text=True
    )


def run_arm(name: str, repeat: int, steps: int, workdir: Path) -> tuple[Arm, set[str]]:
    """One arm: its result and the nodes that committed its rounds."""
    directory = workdir / f"{name.replace(' ', '_').replace('+', 'and')}-{repeat}"
    directory.mkdir(parents=True)
    beside = (lambda url: dedicated_syncer(url, directory / "syncer.log")) if name == "learners + syncer" else None
    seeds = [[*extra, "--seed", str(10 * repeat + i + 1)] for i, extra in enumerate(ARMS[name])]
    arm = gradientmail_arm(name, {}, "equal", [0.0, 0.0], steps, directory, worker_args=seeds, beside=beside)
    store = RunStore(gm.FileMailbox(directory / "mailbox"))
    committers = {store.read_round(0, v).committed_by for v in store.committed_versions(0) if v > 0}
    return arm, committers


def takeover(workdir: Path, steps: int) -> tuple[float, float]:
    """Seconds from the dedicated syncer's SIGKILL to a training node's lease, and the bound."""
    box = workdir / "takeover"
    box.mkdir(parents=True)
    url = f"file://{box}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    learners = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "demo.worker",
                "--mailbox",
                url,
                "--learner-id",
                f"learner-{i}",
                "--steps",
                str(steps),
                "--seed",
                str(i),
                "--step-sleep",
                "0.05",
                "--eval-windows",
                "8",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(workdir / f"takeover-{i}.log").open("w"),
            text=True,
        )
        for i in (1, 2)
    ]
    syncer = dedicated_syncer(url, workdir / "takeover-syncer.log")
    store = RunStore(gm.FileMailbox(box))
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            versions = store.committed_versions(0) if (box / "manifest.json").exists() else []
            if any(store.read_round(0, v).committed_by == "cpu-sync" for v in versions if v > 0):
                break
            time.sleep(0.1)
        else:
            raise SystemExit("the dedicated syncer committed nothing in 600 s")
        spec = store.read_spec()
        bound = spec.lease_ttl_s + MTIME_RESOLUTION_S + gm.SessionOptions().poll_interval_s
        syncer.send_signal(signal.SIGKILL)
        syncer.wait()
        killed = time.monotonic()
        while time.monotonic() - killed < 10 * bound:
            found = store.leases.read_syncer()
            if found is not None and found.lease is not None and found.lease.holder != "cpu-sync":
                return time.monotonic() - killed, bound
            time.sleep(0.02)
        raise SystemExit(f"no training node took the syncer lease within {10 * bound:.0f} s")
    finally:
        for process in [*learners, syncer]:
            if process.poll() is None:
                process.kill()
                process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=MIN_RUNS)
    parser.add_argument("--takeover-only", action="store_true", help="only the takeovers after the dedicated syncer's kill")
    args = parser.parse_args(argv)
    if args.takeover_only:
        with tempfile.TemporaryDirectory(prefix="gm-roles-") as tmp:
            judge_takeovers(Path(tmp), args.repeats, args.steps)
        return 0
    print(f"roles: 2 learners, {args.steps} steps, H = 50, {args.repeats} repeats, {os.cpu_count()} cores", flush=True)
    losses: dict[str, list[float]] = {name: [] for name in ARMS}
    rounds: dict[str, list[int]] = {name: [] for name in ARMS}
    merged: dict[str, list[float]] = {name: [] for name in ARMS}
    with tempfile.TemporaryDirectory(prefix="gm-roles-") as tmp:
        for repeat in range(args.repeats):
            for name in ARMS:
                arm, committers = run_arm(name, repeat, args.steps, Path(tmp))
                losses[name].append(arm.val_loss)
                rounds[name].append(arm.rounds)
                merged[name].append(arm.merged_share)
                elected = ""
                if name == "either + both":
                    paused = committers == {"learner-1"}
                    elected = " (the either node was elected: it paused)" if paused else " (the both node was elected)"
                print(
                    f"  repeat {repeat}: {name:18s} held-out loss {arm.val_loss:.4f}, {arm.rounds} rounds, "
                    f"merged {arm.merged_share:.0%} of steps, committed by {sorted(committers)}{elected}, {arm.wall_s:.0f} s",
                    flush=True,
                )
        reference = statistics.median(losses["both"])
        print()
        for name, values in losses.items():
            median = statistics.median(values)
            print(f"{name:18s} median {median:.4f} ({min(values):.4f}–{max(values):.4f}) = {median / reference:.4f}x both")
        dedicated = "learners + syncer"
        same = min(merged[dedicated]) >= min(merged["both"])
        judged = [
            check(
                f"{dedicated} merges every step both merges (rounds {rounds[dedicated]} vs {rounds['both']}: "
                "the last, flushing round may group differently)",
                same,
                runs=len(losses["both"]),
            ),
            within_noise(f"{dedicated} no worse than both", losses[dedicated], losses["both"], no_worse=True),
        ]
        for v in judged:
            print(v.line())
        print("either + both: reported, not judged (an elected either node pauses, so its run is another run)")
        judge_takeovers(Path(tmp), args.repeats, args.steps)
    return 0


def judge_takeovers(workdir: Path, repeats: int, steps: int) -> None:
    """Kill the dedicated syncer ``repeats`` times (a run each) and judge the slowest takeover."""
    taken = [takeover(workdir / f"repeat-{repeat}", steps=max(steps, 400)) for repeat in range(repeats)]
    bound = taken[0][1]
    seconds = [s for s, _ in taken]
    print(f"takeovers after the dedicated syncer's SIGKILL: {', '.join(f'{s:.2f} s' for s in seconds)}", flush=True)
    verdict = check(
        f"takeover after the dedicated syncer's SIGKILL: slowest {max(seconds):.2f} s ≤ TTL + stamp + poll = {bound:.2f} s",
        max(seconds) <= bound,
        runs=len(seconds),
    )
    print(verdict.line())


if __name__ == "__main__":
    sys.exit(main())
