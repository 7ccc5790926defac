"""The simulator's round model against real rounds: calibrate on some configurations, predict others.

    python -m benchmarks.sim_calibration                   # fit on 2x64,4x256,16x16,16x64; predict 8 × 16/64/256 MB
    python -m benchmarks.sim_calibration --fewer-cores 1   # also the predictions measured and predicted on 1 core
    python -m benchmarks.sim_calibration --from-round-grid runs/round-*/result.json   # a round grid's rounds
    python -m benchmarks.sim_calibration --quick           # 1 repeat of small rounds: a smoke run
    python -m benchmarks.sim_calibration --spread-result runs/spread-*/result.json

The simulator prices a round as ``Model.sync_s(M)``: a fixed cost, the M contributions' collect
(``Model.collect_s``: their bytes at the link's rate or at the core-seconds per GB the collect
takes spread over the node's cores, whichever is slower), their bytes at the merge rate, and the
fragment's bytes at its write rate (the outer step, then the new parameters and the outer state
written). Calibration: real rounds (``benchmarks.round.one_round``: M learners publish, one pass
of the real syncer closes the round on loopback SeaweedFS) at each ``--calibrate`` configuration,
repeated; per configuration the median of each phase, then a least-squares fit through them,
per contribution and per byte (docs/simulator.md, "Calibrated on a real store"). On loopback the link is no bound and the
core-seconds are this machine's, the store's included. Prediction: the calibrated model's
``sync_s`` for each ``--predict`` configuration (none of them used in the fit), against the same
real round measured ``--repeat`` times, interleaved so a slow spell of the machine hits every
configuration; with ``--fewer-cores N`` the predictions are measured again with this process and
the store pinned to N cores (the kernels' threads N too) and predicted with ``syncer_cores = N``.
``--from-round-grid`` takes the rounds of a ``benchmarks.round --rounds-only --grid`` run instead,
so one grid serves both benchmarks.

With ``--spread-result`` (the JSON ``benchmarks.spread`` writes), the layouts' closed forms are
set beside that real-process run too: the busiest node's syncer bytes over the mean node's for
one syncer and for ``spread``, and the learners per round at the run's arrival spread and grace.

Targets (issues 26, 44): each predicted round time within ±10 % of the measured median, at
8 × 16, 64 and 256 MB (rounds up to 2 GB).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cpu import add_memory_option, apply_memory_option
from benchmarks.round import COLLECT_PHASE, FIXED_PHASES, WRITE_PHASE, one_round
from benchmarks.targets import information, verdict, within
from gradientmail.backends import kernels
from gradientmail.simulate import Model
from gradientmail.simulate.bottleneck import busiest_share, carried_per_round
from testing.seaweed import Seaweed

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.10
"""Predicted round time within ±10 % of the measured median (issue 26)."""
POLL_S = 0.2
"""The session's poll interval (``SessionOptions.poll_interval_s``): how late a syncer may notice a round."""
MERGE = "rda"
"""The merge of the timed rounds: the default merge of ``DiLoCo``."""
WRITE_PHASES = ("outer step", WRITE_PHASE, "other (finiteness of the result, to NumPy)")
"""Phases that grow with the fragment's bytes: the step, then the new parameters and the outer state written."""


LOOPBACK_BPS = 1e12
"""The link's rate on loopback: no bound (the collect is bound by the cores, ``collect_core_s_per_gb``)."""


def line_through(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y on x; through the origin when every x is the same."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return 0.0, statistics.median(y for _, y in points) / xs[0]
    slope, intercept = statistics.linear_regression(xs, [y for _, y in points])
    return intercept, slope


def plane_through(points: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Least-squares (intercept, per-contribution, per-byte) of a collect's seconds on its
    contributions and its bytes; per byte alone (through the origin) when the contribution counts
    or the bytes do not vary enough to tell the two apart."""
    design = np.array([[1.0, m, nbytes] for m, nbytes, _ in points])
    seconds = np.array([y for _, _, y in points])
    if len(points) < 3 or np.linalg.matrix_rank(design) < 3:
        intercept, slope = line_through([(nbytes, y) for _, nbytes, y in points])
        return intercept, 0.0, slope
    intercept, per_contribution, per_byte = np.linalg.lstsq(design, seconds, rcond=None)[0]
    return float(intercept), float(per_contribution), float(per_byte)


def calibrated_model(rounds: list[dict[str, Any]], cores: int) -> tuple[Model, dict[str, float]]:
    """The round's rates fitted on ``rounds`` (one or more configurations, measured on ``cores``
    cores): per configuration the median of each phase, then a least-squares fit through the
    configurations for the collect (seconds per contribution and per byte of contributions: the
    latter core-seconds per GB once times the cores), a line for the merge (per byte of
    contributions) and for the step and write (per byte of fragment); the
    fixed cost is the median of the phases that do not grow with bytes plus the lines' intercepts."""
    configs = sorted({(r["m"], r["mb"]) for r in rounds})

    def median(config: tuple[int, float], names: tuple[str, ...] | str) -> float:
        names = (names,) if isinstance(names, str) else names
        return statistics.median(sum(r["phases"][n]["s"] for n in names) for r in rounds if (r["m"], r["mb"]) == config)

    contributed = [(m * mb * 1e6, (m, mb)) for m, mb in configs]
    collect_0, per_contribution, collect_slope = plane_through(
        [(m, m * mb * 1e6, median((m, mb), COLLECT_PHASE)) for m, mb in configs]
    )
    merge_0, merge_slope = line_through([(x, median(c, "merge")) for x, c in contributed])
    write_0, write_slope = line_through([(mb * 1e6, median((m, mb), WRITE_PHASES)) for m, mb in configs])
    fixed = statistics.median(median(c, FIXED_PHASES) for c in configs)
    fitted = {
        "syncer_round_overhead_s": max(0.0, fixed + collect_0 + merge_0 + write_0),
        "syncer_contribution_s": max(per_contribution, 0.0),
        "collect_core_s_per_gb": max(collect_slope, 1e-15) * 1e9 * cores,
        "syncer_cores": float(cores),
        "syncer_bandwidth_bps": LOOPBACK_BPS,
        "merge_bytes_per_s": 1.0 / max(merge_slope, 1e-13),
        "syncer_write_bps": 1.0 / max(write_slope, 1e-13),
    }
    m, mb = configs[0]
    model = Model(fragments=1, model_bytes=mb * 1e6, quorum_size=m, **fitted)
    return model, fitted


def predicted_s(model: Model, m: int, mb: float, cores: int) -> float:
    return model.with_(model_bytes=mb * 1e6, quorum_size=m, syncer_cores=float(cores)).sync_s(m)


@contextlib.contextmanager
def on_cores(cpus: set[int], *pids: int) -> Iterator[None]:
    """This process and ``pids`` on ``cpus`` for the block, with the kernels' threads as many as
    those cores (as a node started there would size them); everything back afterwards."""
    every = os.sched_getaffinity(0)
    if cpus == every:
        yield
        return
    previous = kernels.set_kernel_threads(len(cpus))
    for pid in (os.getpid(), *pids):
        pin(pid, cpus)
    try:
        yield
    finally:
        for pid in (os.getpid(), *pids):
            pin(pid, every)
        kernels.set_kernel_threads(previous)


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` onto ``cpus`` (Linux sets a thread's affinity, not a
    process's; threads started afterwards inherit their creator's)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cpus)


def parse_configs(text: str) -> list[tuple[int, float]]:
    """``4x32,8x16`` → [(4, 32.0), (8, 16.0)]: M contributions × MB each."""
    configs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        m, _, mb = item.partition("x")
        try:
            configs.append((int(m), float(mb)))
        except ValueError:
            raise SystemExit(f"sim_calibration: a configuration is MxMB (e.g. 4x32), got {item!r}") from None
    return configs


def spread_checks(path: Path) -> list[Any]:
    """The layouts' closed forms beside a real ``benchmarks.spread`` run (information: one run file)."""
    data = json.loads(path.read_text())
    learners = int(data["config"]["learners"])
    rows = []
    for layout in ("one", "spread"):
        model = Model(fragments=learners, syncer_layout=layout)
        predicted = busiest_share(model, learners)
        for arm in data["arms"][layout]:
            loads = [arm["syncer_bytes_by_node"].get(f"learner-{i + 1}", 0) for i in range(learners)]
            measured = max(loads) / (sum(loads) / learners)
            rows.append((layout, predicted, measured))
    verdicts = []
    for layout in ("one", "spread"):
        mine = [(p, m) for lay, p, m in rows if lay == layout]
        verdicts.append(
            verdict(
                f"busiest node's syncer bytes ÷ mean, {layout}: predicted {mine[0][0]:.2f}× within ±10 % of measured",
                [p / m for p, m in mine],
                within(TOLERANCE),
                setting=f"syncer_layout={layout}",
                judged_at=f"syncer_layout={layout}",
                detail="measured " + ", ".join(f"{m:.2f}×" for _, m in mine),
            )
        )
    return verdicts


def mailbox_rounds(box: Path) -> dict[str, float]:
    """Learners per round and the round cycle, read back from the round records of fragment 0 in a
    directory mailbox: the mean participants of the rounds (not the first, not the final flushes),
    and the median grace and ξ_sync the syncer recorded."""
    fragment = box / "fragments" / "0000"
    rounds = [json.loads(path.read_text()) for path in sorted((fragment / "rounds").glob("*.json"))]
    rounds = [r for r in rounds if r["version"] > 0 and not r["final"] and r.get("timing")]
    if not rounds:
        raise RuntimeError(f"the run left no round records in {box}")
    return {
        "participants": statistics.mean(len(r["participants"]) for r in rounds),
        "grace_s": statistics.median(r["timing"]["grace_s"] for r in rounds),
        "sync_s": statistics.median(r["timing"]["sync_s"] for r in rounds),
        "rounds": len(rounds),
    }


PARTICIPATION_ARMS: tuple[tuple[str, dict[str, Any], float], ...] = (
    ("short steps, grace_rule=slack", {"grace_rule": "slack"}, 0.0),
    ("short steps, the defaults", {}, 0.0),
    ("0.1 s more per step, grace_rule=slack", {"grace_rule": "slack"}, 0.1),
)
"""(name, DiLoCo knobs, seconds slept after each step): rounds that close on one learner, rounds
that wait for every live learner, and slack with longer steps."""


def participation(scratch: Path, learners: int, steps: int, sync_every: int) -> list[dict[str, Any]]:
    """Real learner processes (the regime matrix's short-step model) per arm; the form's learners
    per round from the run's own period (H over the learners' median step rate, phases taken evenly
    round it) and round window (recorded grace + poll) and ξ_sync, beside the measured mean."""
    from benchmarks.arms import gradientmail_arm
    from benchmarks.regimes import SHORT_STEP_MODEL

    rows = []
    for name, knobs, sleep in PARTICIPATION_ARMS:
        workdir = scratch / name.replace(" ", "-").replace(",", "").replace("=", "-").replace(".", "")
        workdir.mkdir(parents=True)
        arm = gradientmail_arm(
            name, knobs, "equal", [sleep] * learners, steps, workdir, sync_every=sync_every, config=SHORT_STEP_MODEL
        )
        seen = mailbox_rounds(workdir / "mailbox")
        period = sync_every / statistics.median(arm.steps_per_s.values())
        window = seen["grace_s"] + POLL_S
        spread = period * (learners - 1) / learners  # phases evenly round the period
        predicted = carried_per_round(learners, spread, window, seen["sync_s"])
        rows.append({"arm": name, **seen, "period_s": period, "window_s": window, "predicted": predicted})
        print(
            f"  {name:<40} period {period:6.3f} s, window {window:6.3f} s "
            f"(grace {seen['grace_s']:.3f} + poll), ξ_sync {seen['sync_s']:.3f}: predicted {predicted:.2f}, "
            f"measured {seen['participants']:.2f} learners a round over {seen['rounds']} rounds"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calibrate",
        default="2x64,4x256,16x16,16x64",
        help="the configurations the rates are fitted on (MxMB, comma-separated; rounds of up to 1 GB, predicted up to 2 GB)",
    )
    parser.add_argument("--predict", default="8x16,8x64,8x256", help="configurations predicted (MxMB, comma-separated)")
    parser.add_argument(
        "--fewer-cores",
        type=int,
        default=None,
        help="also measure the predicted configurations with this process and the store on this many cores, "
        "predicted with the cores the collect had",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--from-round-grid",
        type=Path,
        default=None,
        help="take the rounds from a `benchmarks.round --rounds-only --grid` result.json (this machine) instead of running them",
    )
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2x4,2x8 calibrated, 4x4 predicted")
    parser.add_argument("--spread-result", type=Path, default=None, help="a benchmarks.spread result.json to compare with")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    parser.add_argument(
        "--participation", action="store_true", help="also the learners per round of real short-step runs (~5 minutes)"
    )
    parser.add_argument("--learners", type=int, default=4, help="with --participation")
    parser.add_argument("--steps", type=int, default=400, help="with --participation")
    add_memory_option(parser, default="retained")  # as a gradientmail node runs
    args = parser.parse_args(argv)
    apply_memory_option(args.memory)
    if args.quick:
        args.calibrate, args.predict, args.repeat = "2x4,2x8", "4x4", 1
    calibrations = parse_configs(args.calibrate)
    predictions = parse_configs(args.predict)
    cores = sorted(os.sched_getaffinity(0))
    fewer = args.fewer_cores
    if fewer is not None and not 1 <= fewer < len(cores):
        raise SystemExit(f"sim_calibration: --fewer-cores must be 1 to {len(cores) - 1} on this machine, got {fewer}")
    out = args.json or ROOT / "runs" / f"sim-calibration-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}" / "result.json"
    arms = [(len(cores), c) for c in dict.fromkeys([*calibrations, *predictions])]
    arms += [(fewer, c) for c in predictions] if fewer is not None else []
    measured: dict[tuple[int, tuple[int, float]], list[dict[str, Any]]] = {arm: [] for arm in arms}
    if args.from_round_grid is not None:  # the rounds of a benchmarks.round --grid run, this machine's cores
        for r in json.loads(args.from_round_grid.read_text())["grid"]:
            arm = (len(cores), (r["m"], r["mb"]))
            if arm in measured and r["merge"] == MERGE:
                measured[arm].append(r)
        missing = [f"{m}x{mb:g}" for (n, (m, mb)), found in measured.items() if not found]
        if missing:
            raise SystemExit(f"sim_calibration: {args.from_round_grid} has no {MERGE} rounds of {', '.join(missing)}")
        args.repeat = min(len(found) for found in measured.values())
    else:
        with tempfile.TemporaryDirectory(prefix="gm-simcal-") as scratch:
            weed = Seaweed.start(Path(scratch))
            try:
                for _ in range(args.repeat):  # interleaved, so a slow spell of the machine hits every arm
                    for n, (m, mb) in arms:
                        with on_cores(set(cores[:n]), weed.process.pid):
                            measured[(n, (m, mb))].append(one_round(weed, MERGE, m, mb, floor=False))
            finally:
                weed.stop()
    model, fitted = calibrated_model([r for c in calibrations for r in measured[(len(cores), c)]], len(cores))
    named = ", ".join(f"{m} × {mb:g}" for m, mb in calibrations)
    print(f"calibrated on M × MB = {named} ({args.repeat} rounds each, medians of the phases, {len(cores)} cores):")
    print(
        f"  fixed {fitted['syncer_round_overhead_s'] * 1000:.1f} ms per round and "
        f"{fitted['syncer_contribution_s'] * 1000:.1f} ms per contribution; collect "
        f"{fitted['collect_core_s_per_gb']:.2f} core-s per GB of contributions ({len(cores)} cores: "
        f"{len(cores) / fitted['collect_core_s_per_gb']:.2f} GB/s); merge {fitted['merge_bytes_per_s'] / 1e6:.0f} MB/s; "
        f"step + write {fitted['syncer_write_bps'] / 1e6:.0f} MB/s of fragment"
    )
    print(
        f"\n  {'cores':>5} {'M × MB':>10} {'predicted s':>12} {'measured s (median, min–max)':>32} {'predicted ÷ measured':>22}"
    )
    rows, verdicts = [], []
    for n, (m, mb) in arms:
        seconds = [r["whole_s"] for r in measured[(n, (m, mb))]]
        guess = predicted_s(model, m, mb, n)
        ratios = [guess / s for s in seconds]
        role = "calibration" if (m, mb) in calibrations and n == len(cores) else "prediction"
        print(
            f"  {n:5d} {f'{m} × {mb:g}':>10} {guess:12.3f} {statistics.median(seconds):12.3f} "
            f"({min(seconds):.3f}–{max(seconds):.3f}) {guess / statistics.median(seconds):21.2f}×  {role}"
        )
        rows.append({"cores": n, "m": m, "mb": mb, "role": role, "predicted_s": guess, "measured_s": seconds})
        on = f"M = {m} × {mb:g} MB" + ("" if n == len(cores) else f", {n} of {len(cores)} cores")
        if role == "prediction":
            verdicts.append(verdict(f"predicted round time within ±{TOLERANCE:.0%} of measured, {on}", ratios, within(TOLERANCE)))
        else:
            verdicts.append(information(f"a calibration round, {on} (predicted ÷ measured)", ratios))
    if args.spread_result is not None:
        verdicts += spread_checks(args.spread_result)
    carried: list[dict[str, Any]] = []
    if args.participation:
        print(f"\nlearners per round, {args.learners} real learner processes, H = 20, {args.steps} steps, a directory mailbox:")
        with tempfile.TemporaryDirectory(prefix="gm-simcal-") as scratch:
            carried = participation(Path(scratch), args.learners, args.steps, 20)
        verdicts += [
            information(
                f"learners per round, {row['arm']}: predicted ÷ measured (one run)", row["predicted"] / row["participants"]
            )
            for row in carried
        ]
    print("\n== targets ==")
    for v in verdicts:
        print(f"  {v.line('{:.3f}')}")
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "fitted": fitted,
        "rounds": rows,
        "participation": carried,
        "targets": [v.as_json() for v in verdicts],
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
