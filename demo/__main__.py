"""``python -m demo``: a local Decoupled DiLoCo run on this machine, no server.

Three learner processes (by default) train a tiny GPT on Shakespeare through a directory
mailbox under ``runs/<timestamp>/mailbox``; a single learner without GradientMail trains
beside them on the same number of tokens. The screen shows each process's progress and a
line per committed round; at the end, a table of validation losses.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import time
from collections.abc import Sequence
from contextlib import closing
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

from demo import settings
from demo.baseline import BASELINE_ID
from demo.data import CorpusMissing, play_paths
from demo.display import Display, ProcessState, format_results, format_round, merged_share, summarize_rounds
from demo.launcher import Launcher, share_cores
from demo.reference import REFERENCE_ID
from demo.rounds import RoundWatcher
from gradientmail.mailbox import open_mailbox
from gradientmail.regime import carried_work_hint, measure_work_loss, work_loss_hint

COMMITTED_ID = "committed"
"""Learner id of the closing evaluation: joins with 0 steps and reads the newest commit."""
_POLL_S = 0.25


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=settings.LEARNERS, help="learner processes (default %(default)s)")
    parser.add_argument("--steps", type=int, default=settings.STEPS, help="local steps per learner (default %(default)s)")
    parser.add_argument(
        "--sync-every", type=int, help=f"H, steps between exchanges of a fragment (default {settings.SYNC_EVERY})"
    )
    parser.add_argument("--fragments", type=int, default=settings.FRAGMENTS, help="P (default %(default)s)")
    parser.add_argument(
        "--outer-lr", type=float, default=settings.OUTER_LR, help="Nesterov outer learning rate (default %(default)s)"
    )
    parser.add_argument(
        "--outer-momentum", type=float, default=settings.OUTER_MOMENTUM, help="Nesterov outer momentum (default %(default)s)"
    )
    parser.add_argument(
        "--quorum", type=int, help=f"K, contributions a round waits for (default {settings.QUORUM}, at most --learners)"
    )
    parser.add_argument("--merge", choices=["rda", "mean"], default="rda", help="merge of the deltas (default %(default)s)")
    parser.add_argument(
        "--batch-size", type=int, default=settings.BATCH_SIZE, help="windows per learner step (default %(default)s)"
    )
    parser.add_argument(
        "--mlx-learners",
        type=int,
        default=0,
        help="how many of the learners use MLX instead of PyTorch; they train until the PyTorch ones finish",
    )
    parser.add_argument(
        "--sync-reference",
        action="store_true",
        help="also train synchronous DiLoCo (same learners, H, outer step) for the closing table; about +50 %% time",
    )
    parser.add_argument("--runs-dir", default="runs", help="where runs/<timestamp>/ is created (default %(default)s)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{settings.QUICK_STEPS} steps, H={settings.QUICK_SYNC_EVERY}: a smoke test in well under a minute",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = settings.QUICK_STEPS
    if args.sync_every is None:
        args.sync_every = settings.QUICK_SYNC_EVERY if args.quick else settings.SYNC_EVERY
    if args.quorum is None:
        args.quorum = min(settings.QUORUM, args.learners)
    if args.learners < 1 or args.steps < 1 or args.fragments < 1 or args.sync_every < 1 or args.batch_size < 1:
        parser.error("--learners, --steps, --sync-every, --fragments and --batch-size must be positive")
    if not 1 <= args.quorum <= args.learners:
        parser.error("--quorum must be between 1 and --learners")
    if not 0 <= args.mlx_learners <= args.learners:
        parser.error("--mlx-learners must be between 0 and --learners")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        play_paths()
    except CorpusMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    began = time.monotonic()
    run_dir = Path(args.runs_dir).absolute() / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    mailbox_dir = run_dir / "mailbox"
    mailbox_dir.mkdir(parents=True)
    mailbox_url = "file://" + quote(str(mailbox_dir))
    with closing(open_mailbox(mailbox_url)) as mailbox:  # the launcher's read-only view of the run
        return _run(args, run_dir, mailbox_dir, mailbox_url, RoundWatcher(mailbox), began)


def _run(
    args: argparse.Namespace, run_dir: Path, mailbox_dir: Path, mailbox_url: str, watcher: RoundWatcher, began: float
) -> int:
    """Start the learners and the baseline, show their progress, then the closing evaluation and results."""
    stop_file = run_dir / "stop"  # tells MLX learners the PyTorch ones are done
    names = [f"learner-{i + 1}" for i in range(args.learners)]
    frameworks = {name: "mlx" if i >= args.learners - args.mlx_learners else "torch" for i, name in enumerate(names)}
    baseline_batch = args.learners * args.batch_size
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    learner_niceness, baseline_threads = share_cores(cores, args.learners)
    _print_header(args, run_dir, mailbox_url, cores, learner_niceness, baseline_threads)

    launcher = Launcher(run_dir / "logs")
    states = {name: ProcessState(name, "learner") for name in names}
    states[BASELINE_ID] = ProcessState(BASELINE_ID, "baseline")
    if args.sync_reference:
        states[REFERENCE_ID] = ProcessState(REFERENCE_ID, "reference")
    display = Display(list(states.values()))
    common = [
        "--sync-every",
        str(args.sync_every),
        "--fragments",
        str(args.fragments),
        "--batch-size",
        str(args.batch_size),
        "--outer-lr",
        str(args.outer_lr),
        "--outer-momentum",
        str(args.outer_momentum),
        "--quorum",
        str(args.quorum),
        "--merge",
        args.merge,
    ]
    try:
        for seed, name in enumerate(names, start=1):
            extra = ["--stop-file", str(stop_file)] if frameworks[name] == "mlx" else []
            launcher.start(
                name,
                "worker",
                [
                    "--mailbox",
                    mailbox_url,
                    "--learner-id",
                    name,
                    "--steps",
                    str(args.steps),
                    "--seed",
                    str(seed),
                    "--framework",
                    frameworks[name],
                    "--niceness",
                    str(learner_niceness),
                    *common,
                    *extra,
                ],
            )
        launcher.start(
            BASELINE_ID,
            "baseline",
            ["--steps", str(args.steps), "--batch-size", str(baseline_batch), "--threads", str(baseline_threads)],
        )
        if args.sync_reference:
            reference = ["--replicas", str(args.learners), "--steps", str(args.steps), "--sync-every", str(args.sync_every)]
            reference += ["--batch-size", str(args.batch_size), "--outer-lr", str(args.outer_lr)]
            launcher.start(REFERENCE_ID, "reference", [*reference, "--outer-momentum", str(args.outer_momentum)])
        failed = _follow(launcher, states, display, watcher, frameworks, stop_file)
        display.finish()
        if failed:
            return _report_failure(launcher, failed)

        # the closing evaluation: a learner that joins, trains nothing and reads the newest commit
        committed_state = ProcessState(COMMITTED_ID, "evaluator")
        launcher.start(
            COMMITTED_ID,
            "worker",
            ["--mailbox", mailbox_url, "--learner-id", COMMITTED_ID, "--steps", "0", "--seed", "0", "--no-syncer", *common],
        )
        failed = _follow(launcher, {COMMITTED_ID: committed_state}, None, watcher, {}, stop_file)
        if failed:
            return _report_failure(launcher, failed)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the learners", file=sys.stderr)
        return 130
    finally:
        launcher.stop_all()

    _print_results(watcher, states, names, committed_state, mailbox_dir, run_dir, time.monotonic() - began, args.fragments)
    return 0


def _print_header(
    args: argparse.Namespace, run_dir: Path, mailbox_url: str, cores: int, learner_niceness: int, baseline_threads: int
) -> None:
    print(f"run       {run_dir}")
    print(f"mailbox   {mailbox_url}")
    print(
        f"learners  {args.learners} × {args.steps} steps × {args.batch_size} windows; "
        f"DiLoCo H={args.sync_every}, P={args.fragments}, K={args.quorum}; "
        f"baseline: {args.steps} steps × {args.learners * args.batch_size} windows"
    )
    print(f"cores     {cores}: learners at niceness {learner_niceness}, baseline on {baseline_threads} thread(s)")
    print(f"logs      {run_dir / 'logs'}")


def _print_results(
    watcher: RoundWatcher,
    states: dict[str, ProcessState],
    names: list[str],
    committed_state: ProcessState,
    mailbox_dir: Path,
    run_dir: Path,
    elapsed_s: float,
    fragments: int,
) -> None:
    print()
    watcher.poll()
    print(summarize_rounds(watcher.records))
    baseline = states[BASELINE_ID]
    initial = (baseline.start or {}).get("initial_val_loss")
    committed = (committed_state.final or {}).get("val_loss")
    learner_steps = sum((states[n].final or {}).get("steps", 0) for n in names)
    share = merged_share(watcher.records, learner_steps, fragments)
    lines = format_results(initial, [states[n] for n in names], committed, baseline, states.get(REFERENCE_ID), share)
    for line in lines:
        print(line)
    spec = watcher.store.read_spec()
    loss = measure_work_loss(watcher.records, share)
    for hint in (work_loss_hint(loss, spec.algorithm), carried_work_hint(loss, spec.algorithm)):
        if hint is not None:
            print(hint)
    size_mb = sum(f.stat().st_size for f in mailbox_dir.rglob("*") if f.is_file()) / 1e6
    print(f"total time {elapsed_s:.0f} s; mailbox ({size_mb:.0f} MB under the default retention) and logs in {run_dir}")


def _follow(
    launcher: Launcher,
    states: dict[str, ProcessState],
    display: Display | None,
    watcher: RoundWatcher,
    frameworks: dict[str, str],
    stop_file: Path,
) -> list[str]:
    """Fold events and show rounds until every process in ``states`` exits; return the failed ones."""
    running = set(states)
    failed: list[str] = []
    while running:
        try:
            name, event = launcher.events.get(timeout=_POLL_S)
            while True:
                states[name].apply(event)
                if event["event"] == "exit":
                    running.discard(name)
                    if event["returncode"] != 0:
                        failed.append(name)
                name, event = launcher.events.get_nowait()
        except queue.Empty:
            pass
        if failed:
            return failed
        for record in watcher.poll():
            if display is not None:
                display.message(format_round(record))
        torch_learners = [n for n, f in frameworks.items() if f == "torch"]
        if frameworks and not stop_file.exists() and all(states[n].final is not None for n in torch_learners):
            stop_file.touch()
        if display is not None:
            display.refresh()
    return failed


def _report_failure(launcher: Launcher, failed: list[str]) -> int:
    for name in failed:
        child = launcher.children[name]
        print(f"\n{name} failed (exit {child.process.returncode}); the end of {child.log_path}:", file=sys.stderr)
        print(child.stderr_tail(), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
