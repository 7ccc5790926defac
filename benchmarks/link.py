"""Training through one thin shared link: the premise of low-communication training, measured.

    python -m benchmarks.link                          # 1000, 100, 10 Mbit/s; 4 learners; 3 repeats (needs root)
    python -m benchmarks.link --rates 100 --repeats 1  # one link
    python -m benchmarks.link --quick --no-torchft     # a smoke run: a narrow MLP, one repeat, 100 Mbit/s

For each rate, a network namespace whose loopback is one pipe of that rate (``testing.shaped_link``:
HTB, every byte between the processes inside it crosses it once, in total over both directions;
the S3 server's own internal hops are exempted, as a data centre keeps them). Inside it,
``benchmarks.peer_torchft`` runs the same small workload (real learner processes, one torch thread
each, the same seeds, data, H and steps) once per GradientMail setting, each with its own bare
loop in the same run:

* ``defaults``: the bare loop, synchronous DiLoCo (the quality reference, one process: it crosses
  no link), data-parallel (DDP over gloo, every step's gradients all-reduced), torchft's DiLoCo
  (lock-step, gloo, a lighthouse), and GradientMail's defaults on a SeaweedFS inside the link;
* ``int4``: GradientMail with int4 deltas and int4 commits (``delta_quantization`` and
  ``update_quantization``);
* ``sparse``: GradientMail with sparse deltas (1/64 of each chunk) and sparse commits
  (``update_sparsity`` = learners / 64), the plain outer step the sparse codec is made for.

Data-parallel and torchft wait for the pipe at every exchange; on a thin link a whole run of
theirs would take hours, so they run ``--peer-budget-s`` worth of steps at most, predicted from
the bytes their ring moves and the rate (``peer_steps``; at least one exchange), and their
throughput is per step; their loss is compared only when they ran every step.

Per arm and rate: throughput ÷ the bare loop (per step, the bare loop of the same run), final loss
÷ synchronous DiLoCo's, and the bytes that crossed the pipe (the shaped class's counter over that
setting's run). One table, and a plot (``link.png``: throughput and loss against bandwidth, one
line per arm), in ``runs/link-<UTC time>/`` (``--out``). Targets (issue 45; medians of ≥ 3
repeats): at 100 Mbit/s, GradientMail int4 ≥ 0.95× the bare loop's throughput and ≤ 1.01×
synchronous DiLoCo's loss; at 10 Mbit/s, sparse ≥ 0.9× the bare loop's throughput (its loss
printed). Without root, ``ip`` or ``tc`` it says why and exits 0 (nothing was measured).

Delay is not part of this benchmark yet: without ``netem`` it has to come from a proxy in front
of each server (``testing.delay_proxy``), which gloo's peer connections cannot go through.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.peer_worker import CLASSES, INPUTS
from benchmarks.targets import Verdict, at_least, at_most, information, verdict
from testing.shaped_link import ShapedLink, unavailable

ROOT = Path(__file__).resolve().parent.parent
RATES_MBIT = (1000.0, 100.0, 10.0)
LEARNERS = 4
SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "int4": {"delta_quantization": "int4", "update_quantization": "int4"},
    "sparse": {"delta_sparsity": 1 / 64, "update_sparsity": LEARNERS / 64, "outer_lr": 1.0, "outer_momentum": 0.0},
}
"""GradientMail's settings, each a run of its own inside the link (``gm.DiLoCo`` fields)."""
ARMS_OF = {"defaults": "bare,sync,ddp,torchft,gm-s3", "int4": "bare,gm-s3", "sparse": "bare,gm-s3"}
ROW_NAMES = {
    ("defaults", "ddp"): "data-parallel (DDP, gloo)",
    ("defaults", "torchft"): "torchft DiLoCo (lock-step)",
    ("defaults", "gm-s3"): "GradientMail defaults",
    ("int4", "gm-s3"): "GradientMail int4 both ways",
    ("sparse", "gm-s3"): "GradientMail sparse",
}
INT4_THROUGHPUT, INT4_LOSS, SPARSE_THROUGHPUT = 0.95, 1.01, 0.90


def mlp_parameters(hidden: int) -> int:
    """The peer workload's parameter count (``benchmarks.peer_worker.build_model``)."""
    return INPUTS * hidden + hidden + hidden * hidden + hidden + hidden * CLASSES + CLASSES


def peer_steps(rate_mbit: float, parameters: int, learners: int, steps: int, sync_every: int, budget_s: float) -> dict[str, int]:
    """Steps of data-parallel and torchft that fit ``budget_s`` on the pipe: a ring all-reduce of
    fp32 parameters puts 2(n − 1)/n × 4 bytes × parameters on the wire per rank, n ranks, all
    through the one pipe; DDP does it every step, torchft every H. At least one exchange each,
    at most ``steps``."""
    ring_bytes = 2 * (learners - 1) * 4 * parameters
    seconds_per_exchange = ring_bytes * 8 / (rate_mbit * 1e6)
    exchanges = max(1, math.floor(budget_s / seconds_per_exchange))
    return {"ddp": min(steps, exchanges), "torchft": min(steps, max(1, exchanges) * sync_every)}


@dataclass
class Row:
    """One arm at one rate: medians over repeats."""

    name: str
    rate_mbit: float
    throughput: float
    throughputs: list[float]
    loss: float
    loss_ratio: float | None
    loss_ratios: list[float]
    steps: int
    full_steps: int
    crossed_mb: float
    """Megabytes through the pipe over the whole run of this arm's setting (every arm in it)."""
    extra: dict[str, Any] = field(default_factory=dict)


def run_setting(
    link: ShapedLink, setting: str, args: argparse.Namespace, out: Path, peer: dict[str, int], tf: list[str]
) -> dict[str, Any]:
    """``benchmarks.peer_torchft`` for one GradientMail setting, inside ``link``."""
    result = out / f"{link.rate_mbit:g}mbit" / setting / "result.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "benchmarks.peer_torchft",
        "--arms", ARMS_OF[setting], "--learners", str(args.learners), "--repeats", str(args.repeats),
        "--steps", str(args.steps), "--sync-every", str(args.sync_every), "--batch", str(args.batch),
        "--hidden", str(args.hidden), "--link-namespace", link.namespace, "--json", str(result),
        "--timeout", str(args.timeout),
    ]  # fmt: skip
    if SETTINGS[setting]:
        command += ["--knobs", json.dumps(SETTINGS[setting])]
    if setting == "defaults":
        command += ["--ddp-steps", str(peer["ddp"]), "--torchft-steps", str(peer["torchft"])]
        command += tf
    before = link.shaped_bytes()
    print(f"  {link.rate_mbit:g} Mbit/s, {setting}: {' '.join(command[2:])}", flush=True)
    done = subprocess.run(link.command(command), cwd=ROOT, text=True, capture_output=True)
    (result.parent / "stdout.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(
            f"peer_torchft at {link.rate_mbit:g} Mbit/s ({setting}) failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    payload: dict[str, Any] = json.loads(result.read_text())
    payload["crossed_bytes"] = link.shaped_bytes() - before
    return payload


def rows_of(rate: float, runs: dict[str, dict[str, Any]]) -> list[Row]:
    sync = runs["defaults"]["arms"]["sync"]
    sync_losses = sync["eval_losses"]
    rows = []
    for (setting, arm), name in ROW_NAMES.items():
        if setting not in runs or arm not in runs[setting]["arms"]:
            continue
        found = runs[setting]["arms"][arm]
        steps = found["trials"][0]["learners"][0]["steps"]
        full = runs[setting]["settings"]["steps"]
        ratios = [loss / ref for loss, ref in zip(found["eval_losses"], sync_losses, strict=False)] if steps == full else []
        rows.append(
            Row(
                name=name,
                rate_mbit=rate,
                throughput=found["throughput_ratio"],
                throughputs=found["throughput_ratios"],
                loss=found["eval_loss"],
                loss_ratio=statistics.median(ratios) if ratios else None,
                loss_ratios=ratios,
                steps=steps,
                full_steps=full,
                crossed_mb=runs[setting]["crossed_bytes"] / 1e6,
                extra={
                    "bytes_up_per_sync": found["bytes_up_per_sync"],
                    "bytes_down_per_sync": found["bytes_down_per_sync"],
                    "bytes_per_contribution": found.get("bytes_per_contribution"),
                    "period_need": found.get("period_need"),
                    "blocked_ms_per_sync": found.get("blocked_ms_per_sync"),
                    "link_hints": found.get("link_hints", []),
                },
            )
        )
    return rows


def print_table(rows: list[Row], sync_loss: dict[float, float]) -> None:
    header = (
        f"{'Mbit/s':>8}  {'arm':<30}{'× bare (per step)':>19}{'loss':>8}{'÷ sync':>8}{'steps':>8}{'MB on the pipe':>16}"
        f"{'need ÷ period':>15}{'waited ms/sync':>16}"
    )
    print(header)
    print("-" * len(header))
    for rate in sorted({r.rate_mbit for r in rows}, reverse=True):
        print(f"{rate:8g}  {'synchronous DiLoCo (reference)':<30}{'—':>19}{sync_loss[rate]:8.3f}{'1':>8}")
        for r in (r for r in rows if r.rate_mbit == rate):
            ratio = f"{r.loss_ratio:.3f}" if r.loss_ratio is not None else "—"
            steps = f"{r.steps}" if r.steps == r.full_steps else f"{r.steps}/{r.full_steps}"
            need = r.extra.get("period_need")
            needs = f"{need:15.2f}" if need is not None else f"{'—':>15}"
            waited = r.extra.get("blocked_ms_per_sync")
            waits = f"{waited:16.1f}" if waited is not None and r.name.startswith("GradientMail") else f"{'—':>16}"
            print(f"{'':8}  {r.name:<30}{r.throughput:19.3f}{r.loss:8.3f}{ratio:>8}{steps:>8}{r.crossed_mb:16.1f}{needs}{waits}")
    print(
        "× bare: the bare loop's seconds per step ÷ the arm's, same run; ÷ sync: final held-out loss ÷ synchronous\n"
        "DiLoCo's (same seeds; only for arms that ran every step); MB on the pipe: the shaped class's bytes over the\n"
        "whole run of that setting (every arm in it, every repeat). steps a/b: a peer-to-peer arm cut to the budget.\n"
        "need ÷ period: what a sync period's transfers needed ÷ the period, the busiest learner's (its lease's link\n"
        "reading, session.transfer_meter); over 1, the link could not carry a round a period. waited ms/sync: the\n"
        "time session.step() held the training thread, per sync (mean over learners): its snapshot copies and\n"
        "any wait for a commit overlap_steps asks for (none by default); uploads run on the exchange's thread."
    )
    for r in rows:
        for hint in r.extra.get("link_hints", [])[:1]:
            print(f"  {r.rate_mbit:g} Mbit/s, {r.name}: gradientmail status would say: {hint}")


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r.name for r in rows):
        mine = sorted((r for r in rows if r.name == name), key=lambda r: r.rate_mbit)
        left.plot([r.rate_mbit for r in mine], [r.throughput for r in mine], marker="o", label=name)
        losses = [(r.rate_mbit, r.loss_ratio) for r in mine if r.loss_ratio is not None]
        if losses:
            right.plot([x for x, _ in losses], [y for _, y in losses], marker="o", label=name)
    for axis, label in ((left, "throughput ÷ bare loop"), (right, "final loss ÷ synchronous DiLoCo")):
        axis.set_xscale("log")
        axis.set_xlabel("link, Mbit/s (shared by every learner)")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    left.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


INT4, SPARSE = "GradientMail int4 both ways", "GradientMail sparse"
TARGETS = (
    (
        INT4,
        100.0,
        "throughputs",
        at_least(INT4_THROUGHPUT),
        f"int4 throughput ≥ {INT4_THROUGHPUT}× the bare loop",
        "int4 both ways",
    ),
    (INT4, 100.0, "loss_ratios", at_most(INT4_LOSS), f"int4 final loss ≤ {INT4_LOSS}× synchronous DiLoCo's", "int4 both ways"),
    (
        SPARSE,
        10.0,
        "throughputs",
        at_least(SPARSE_THROUGHPUT),
        f"sparse throughput ≥ {SPARSE_THROUGHPUT}× the bare loop",
        "sparse",
    ),
)
"""Issue 45's targets: (row, rate, the row's figures, the bound, what it says, the setting it is judged at)."""


def verdicts(rows: list[Row]) -> list[Verdict]:
    def at(name: str, rate: float) -> Row | None:
        return next((r for r in rows if r.name == name and r.rate_mbit == rate), None)

    found: list[Verdict] = []
    for name, rate, figures, ok, says, setting in TARGETS:
        row = at(name, rate)
        if row is not None:
            found.append(verdict(f"{rate:g} Mbit/s: {says}", getattr(row, figures), ok, setting=setting, judged_at=setting))
    sparse = at(SPARSE, 10.0)
    if sparse is not None:
        found.append(information("10 Mbit/s: sparse final loss ÷ synchronous DiLoCo's", sparse.loss_ratios or [sparse.loss]))
    for r in rows:
        if r.name in ("data-parallel (DDP, gloo)", "torchft DiLoCo (lock-step)", "GradientMail defaults"):
            found.append(information(f"{r.rate_mbit:g} Mbit/s: {r.name} throughput ÷ bare", r.throughputs))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.link", description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES_MBIT), help="Mbit/s, comma-separated")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"GradientMail settings, of {', '.join(SETTINGS)}")
    parser.add_argument("--learners", type=int, default=LEARNERS)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sync-every", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024, help="MLP width: 1024 is 1.64M parameters")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--peer-budget-s", type=float, default=60.0, help="the longest a data-parallel or torchft arm may wait on the pipe"
    )
    parser.add_argument("--no-torchft", action="store_true", help="leave out torchft's arm (and its set-up)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per arm and repeat (s)")
    parser.add_argument("--quick", action="store_true", help="100 Mbit/s, 40 steps, H = 10, a narrow MLP, one repeat")
    parser.add_argument("--out", type=Path, default=None, help="default: runs/link-<UTC time>/")
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        print(f"benchmarks.link: not run: {why}")
        return 0
    if args.quick:
        args.rates, args.steps, args.sync_every, args.hidden, args.repeats = "100", 40, 10, 128, 1
    rates = [float(r) for r in args.rates.split(",") if r]
    settings = [s for s in args.settings.split(",") if s]
    unknown = set(settings) - set(SETTINGS)
    if unknown or "defaults" not in settings:
        parser.error(f"--settings: {', '.join(sorted(unknown)) or 'defaults is required (its run holds the references)'}")
    out = args.out.resolve() if args.out else ROOT / "runs" / f"link-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    parameters = mlp_parameters(args.hidden)
    tf = ["--no-torchft"] if args.no_torchft else []
    print(
        f"benchmarks.link: {args.learners} learners, {parameters:,} fp32 parameters, H {args.sync_every}, "
        f"{args.steps} steps, {args.repeats} repeat(s), rates {', '.join(f'{r:g}' for r in rates)} Mbit/s",
        flush=True,
    )
    rows: list[Row] = []
    sync_loss: dict[float, float] = {}
    raw: dict[str, Any] = {}
    for rate in rates:
        peer = peer_steps(rate, parameters, args.learners, args.steps, args.sync_every, args.peer_budget_s)
        runs: dict[str, dict[str, Any]] = {}
        with ShapedLink.create(rate) as link:
            for setting in settings:
                runs[setting] = run_setting(link, setting, args, out, peer, tf)
        raw[f"{rate:g}"] = {
            "peer_steps": peer,
            "runs": {s: {"crossed_bytes": r["crossed_bytes"], "arms": r["arms"]} for s, r in runs.items()},
        }
        sync_loss[rate] = runs["defaults"]["arms"]["sync"]["eval_loss"]
        rows += rows_of(rate, runs)
    print()
    print_table(rows, sync_loss)
    plot(rows, out / "link.png")
    found = verdicts(rows)
    print()
    for v in found:
        print(v.line("{:.3g}"))
    (out / "result.json").write_text(
        json.dumps(
            {
                "settings": vars(args) | {"out": str(out), "parameters": parameters},
                "rows": [r.__dict__ for r in rows],
                "runs": raw,
                "targets": [v.as_json() for v in found],
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    print(f"wrote {out / 'result.json'} and {out / 'link.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
