"""The simulator's round model against real rounds: calibrate on one configuration, predict others.

    python -m benchmarks.sim_calibration                   # calibrate on 4 × 32 MB, predict four others, 3 repeats
    python -m benchmarks.sim_calibration --quick           # 1 repeat of small rounds: a smoke run
    python -m benchmarks.sim_calibration --spread-result runs/spread-*/result.json

The simulator prices a round as ``Model.sync_s(M)``: a fixed cost, the M contributions' bytes at
the closing node's fetch rate (fetch, sha256, decode and the streamed merge) and merge rate, and
the fragment's bytes at its write rate (the outer step, then the new parameters and the outer
state written). Calibration: real rounds (``benchmarks.round.one_round``: M learners publish, one
pass of the real syncer closes the round on loopback SeaweedFS) at ``--calibrate``, repeated; the
rates come from the median of each phase (docs/simulator.md, "Calibrated on a real store").
Prediction: the calibrated model's ``sync_s`` for each ``--predict`` configuration (other M, other
sizes: none of them used in the fit), against the same real round measured ``--repeat`` times,
interleaved so a slow spell of the machine hits every configuration.

With ``--spread-result`` (the JSON ``benchmarks.spread`` writes), the layouts' closed forms are
set beside that real-process run too: the busiest node's syncer bytes over the mean node's for
one syncer and for ``spread``, and the learners per round at the run's arrival spread and grace.

Target (issue 26): each predicted round time within ±10 % of the measured median, for at least
three configurations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.round import COLLECT_PHASE, WRITE_PHASE, one_round
from benchmarks.targets import information, verdict, within
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
FIXED_PHASES = (
    "poll+list (election, leases, head probe, LIST)",
    "commit (read head, create record once, put head)",
    "retention (LIST, DELETE)",
    "unaccounted",
)
"""Phases whose seconds do not grow with the round's bytes."""
WRITE_PHASES = ("outer step", WRITE_PHASE, "other (finiteness of the result, to NumPy)")
"""Phases that grow with the fragment's bytes: the step, then the new parameters and the outer state written."""


def calibrated_model(rounds: list[dict[str, Any]]) -> tuple[Model, dict[str, float]]:
    """The round's rates from the median of each phase over ``rounds`` (one configuration)."""

    def median(names: tuple[str, ...] | str) -> float:
        names = (names,) if isinstance(names, str) else names
        return statistics.median(sum(r["phases"][n]["s"] for n in names) for r in rounds)

    m, mb = rounds[0]["m"], rounds[0]["mb"]
    fragment = mb * 1e6
    fitted = {
        "syncer_round_overhead_s": median(FIXED_PHASES),
        "syncer_bandwidth_bps": m * fragment / median(COLLECT_PHASE),
        "merge_bytes_per_s": m * fragment / max(median("merge"), 1e-4),
        "syncer_write_bps": fragment / median(WRITE_PHASES),
    }
    model = Model(fragments=1, model_bytes=fragment, quorum_size=m, **fitted)
    return model, fitted


def predicted_s(model: Model, m: int, mb: float) -> float:
    return model.with_(model_bytes=mb * 1e6, quorum_size=m).sync_s(m)


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
    parser.add_argument("--calibrate", default="4x32", help="the configuration the rates are fitted on (MxMB)")
    parser.add_argument("--predict", default="2x64,8x16,8x48,3x96", help="configurations predicted (MxMB, comma-separated)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2x4 calibrated, 2x8,4x4 predicted")
    parser.add_argument("--spread-result", type=Path, default=None, help="a benchmarks.spread result.json to compare with")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    parser.add_argument(
        "--participation", action="store_true", help="also the learners per round of real short-step runs (~5 minutes)"
    )
    parser.add_argument("--learners", type=int, default=4, help="with --participation")
    parser.add_argument("--steps", type=int, default=400, help="with --participation")
    args = parser.parse_args(argv)
    if args.quick:
        args.calibrate, args.predict, args.repeat = "2x4", "2x8,4x4", 1
    (calibration,) = parse_configs(args.calibrate)
    predictions = parse_configs(args.predict)
    out = args.json or ROOT / "runs" / f"sim-calibration-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}" / "result.json"
    measured: dict[tuple[int, float], list[dict[str, Any]]] = {c: [] for c in [calibration, *predictions]}
    with tempfile.TemporaryDirectory(prefix="gm-simcal-") as scratch:
        weed = Seaweed.start(Path(scratch))
        try:
            for _ in range(args.repeat):
                for m, mb in measured:
                    measured[(m, mb)].append(one_round(weed, MERGE, m, mb, floor=False))
        finally:
            weed.stop()
    model, fitted = calibrated_model(measured[calibration])
    print(f"calibrated on M = {calibration[0]} × {calibration[1]:g} MB ({args.repeat} rounds, medians of the phases):")
    print(
        f"  fixed {fitted['syncer_round_overhead_s'] * 1000:.1f} ms per round; fetch ∥ merge "
        f"{fitted['syncer_bandwidth_bps'] / 1e6:.0f} MB/s of contributions; merge {fitted['merge_bytes_per_s'] / 1e6:.0f} MB/s; "
        f"step + write {fitted['syncer_write_bps'] / 1e6:.0f} MB/s of fragment"
    )
    print(f"\n  {'M × MB':>10} {'predicted s':>12} {'measured s (median, min–max)':>32} {'predicted ÷ measured':>22}")
    rows, verdicts = [], []
    for m, mb in [calibration, *predictions]:
        seconds = [r["whole_s"] for r in measured[(m, mb)]]
        guess = predicted_s(model, m, mb)
        ratios = [guess / s for s in seconds]
        role = "calibration" if (m, mb) == calibration else "prediction"
        print(
            f"  {f'{m} × {mb:g}':>10} {guess:12.3f} {statistics.median(seconds):12.3f} "
            f"({min(seconds):.3f}–{max(seconds):.3f}) {guess / statistics.median(seconds):21.2f}×  {role}"
        )
        rows.append({"m": m, "mb": mb, "role": role, "predicted_s": guess, "measured_s": seconds})
        if role == "prediction":
            verdicts.append(
                verdict(
                    f"predicted round time within ±{TOLERANCE:.0%} of measured, M = {m} × {mb:g} MB",
                    ratios,
                    within(TOLERANCE),
                )
            )
        else:
            verdicts.append(information(f"the calibration round itself, M = {m} × {mb:g} MB (predicted ÷ measured)", ratios))
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
