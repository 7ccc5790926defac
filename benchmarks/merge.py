"""Merges and the outer step against the machine's copy rate, side by side in one run (issue 13).

    python -m benchmarks.merge [--mb 256] [--m 8] [--repeat 3] [--json PATH] [--threads N] [--no-old]

``--m`` fp32 deltas of ``--mb`` MB each (one tensor per delta, the fragment of a syncer round).
For the NumPy and PyTorch backends (and MLX when importable, for information) it times, ``--repeat``
runs each:

* weighted mean: ``weighted_mean`` (one fused combination);
* RDA standalone: ``rda`` (the norms, then the combination with ‖u‖ in the same pass, then the
  final scale over the output);
* RDA, norms given: ``rda_unscaled`` with the norms validation measured (the syncer's round:
  one combination pass, the scale left to the outer step);
* outer step: ``Backend.outer_update`` on one delta-sized fp32 tensor with the scale folded in
  (reads θ, m, Δ once, writes θ' and m');
* finite_norm: the validation pass over every delta (finiteness and norm together).

Throughput is bytes of input per second (the M deltas; θ, m and Δ for the outer step), and
each run is divided by the copy rate (bytes copied per second) from the deltas into a buffer of
the merge's input size, measured right before it twice: ``np.copyto`` on one thread and split
over one thread per core (NumPy releases the GIL while it copies); the faster of the two is the
reference, since the kernels use every core too. The verdict takes the median of ``--repeat``
runs (``benchmarks/targets.py``); both ratios are printed. Targets (issue 13): weighted mean ≥ 0.5× copy; RDA
standalone ≥ 0.33×; RDA with norms given ≥ 0.5×; outer step ≥ 0.5× (its one pass over θ, m,
Δ runs at least at the merge target's rate: it adds no more than one pass); for information it
also prints the outer step's time over the round's merge pass (RDA with norms given). The
outer step writes two fresh fp32 tensors, whose first-touch page faults (the kernel zeroing
them) the copy into a reused buffer does not pay. ``old`` rows (skip
with ``--no-old``) time the implementation before the fused kernels (the generic
``linear_combination`` loop) for reference. A JSON result goes to ``--json`` (default
``runs/merge-<UTC time>/result.json``).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.targets import at_least, judged, verdict
from benchmarks.timing import against_copy, copy_threads, save_result
from gradientmail.algorithms.merge import NORM_FLOOR, normalized, rda, rda_unscaled, weighted_mean
from gradientmail.backends import Backend, Tensor, get_backend, kernels
from gradientmail.errors import BackendUnavailable

ROOT = Path(__file__).resolve().parent.parent
MB = 1 << 20
TARGETS = {"weighted mean": 0.5, "RDA standalone": 0.33, "RDA, norms given": 0.5, "outer step": 0.5}


def old_weighted_mean(backend: Backend, deltas: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    return backend.linear_combination(list(deltas), normalized(weights))


def old_rda(backend: Backend, deltas: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """RDA as it was before the fused kernels: norms, scaled directions, combination, norm, scale."""
    shares = normalized(weights)
    norms = [backend.norm(d) for d in deltas]
    mean_length = sum(s * n for s, n in zip(shares, norms, strict=True))
    directions = [backend.scale(d, 1.0 / max(n, NORM_FLOOR)) for d, n in zip(deltas, norms, strict=True)]
    direction = backend.linear_combination(directions, shares)
    return backend.scale(direction, mean_length / max(backend.norm(direction), NORM_FLOOR))


def old_outer(backend: Backend, theta: Tensor, momentum: Tensor, delta: Tensor, factor: float) -> Tensor:
    grad = backend.to_fp32(backend.scale(delta, factor))
    new_momentum = backend.add(backend.scale(momentum, 0.9), grad)
    update = backend.scale(backend.add(grad, backend.scale(new_momentum, 0.9)), 0.7)
    return backend.sub(theta, update), new_momentum


Operation = tuple[str, str, int, Callable[[], Any]]
"""(backend, operation, input bytes, action)"""


def operations(backend: Backend, rows: np.ndarray, weights: list[float], old: bool) -> list[Operation]:
    """Every operation on one backend; rows: the M deltas as rows of one fp32 array."""
    if backend.name == "numpy":
        deltas: list[Tensor] = list(rows)
    else:
        deltas = [backend.borrow_numpy(row) for row in rows]
    input_bytes = rows.nbytes
    elements = rows.shape[1]
    theta = backend.from_numpy(np.full(elements, 0.5, np.float32))
    momentum = backend.from_numpy(np.full(elements, 0.01, np.float32))
    norms = [backend.finite_norm(d) for d in deltas]
    _, factor = rda_unscaled(deltas, weights, backend, norms=norms)
    ops: list[tuple[str, int, Callable[[], Any]]] = [
        ("finite_norm", input_bytes, lambda: [backend.finite_norm(d) for d in deltas]),
        ("weighted mean", input_bytes, lambda: weighted_mean(deltas, weights, backend)),
        ("RDA standalone", input_bytes, lambda: rda(deltas, weights, backend)),
        ("RDA, norms given", input_bytes, lambda: rda_unscaled(deltas, weights, backend, norms=norms)),
        (
            "outer step",
            3 * elements * 4,
            lambda: backend.outer_update(theta, momentum, deltas[0], lr=0.7, beta=0.9, delta_scale=factor),
        ),
    ]
    if old:
        ops += [
            ("old weighted mean", input_bytes, lambda: old_weighted_mean(backend, deltas, weights)),
            ("old RDA", input_bytes, lambda: old_rda(backend, deltas, weights)),
            ("old outer step", 3 * elements * 4, lambda: old_outer(backend, theta, momentum, deltas[0], factor)),
        ]
    return [(backend.name, name, nbytes, action) for name, nbytes, action in ops]


def measure(ops: list[Operation], rows: np.ndarray, repeat: int) -> list[dict[str, Any]]:
    """Every run of every operation against the copies timed right before it (one thread and
    one thread per core); per-run ratios to the faster copy, and to each copy for information."""
    if not ops:
        return []
    timed = against_copy([action for _, _, _, action in ops], rows, repeat)
    results = []
    for (name, op, nbytes, _), runs in zip(ops, timed, strict=True):
        ratios = runs.ratios(nbytes, rows.nbytes)
        results.append(
            {
                "backend": name,
                "operation": op,
                "seconds": runs.median_seconds(),
                "runs_seconds": runs.seconds,
                "input_bytes": nbytes,
                "copy_bytes_per_s": runs.copy_rate(rows.nbytes),
                "single_copy_bytes_per_s": runs.copy_rate(rows.nbytes, "single"),
                "threaded_copy_bytes_per_s": runs.copy_rate(rows.nbytes, "threaded"),
                "gb_per_s": nbytes / runs.median_seconds() / 1e9,
                "ratios_to_copy": ratios,
                "ratio_to_copy": statistics.median(ratios),
                "ratio_to_single_copy": statistics.median(runs.ratios(nbytes, rows.nbytes, "single")),
                "ratio_to_threaded_copy": statistics.median(runs.ratios(nbytes, rows.nbytes, "threaded")),
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--mb", type=float, default=256, help="MB per delta (default 256)")
    parser.add_argument("--m", type=int, default=8, help="deltas per merge (default 8)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="kernel threads (default: the CPUs, at most 8)")
    parser.add_argument("--no-old", action="store_true", help="skip the pre-kernel reference rows")
    parser.add_argument("--no-mlx", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads is not None:
        kernels.set_kernel_threads(args.threads)
    threads = kernels.kernel_threads()
    elements = int(args.mb * MB) // 4
    rows = np.empty((args.m, elements), np.float32)
    rng = np.random.default_rng(0)
    for row in rows:
        rng.random(out=row, dtype=np.float32)
        row -= np.float32(0.5)
    weights = [float((i + 1) ** 2) for i in range(args.m)]
    ops: list[Operation] = []
    names = ["numpy", "torch"] + ([] if args.no_mlx else ["mlx"])
    for name in names:
        try:
            backend = get_backend(name)
        except BackendUnavailable:
            print(f"({name} not installed: skipped)")
            continue
        ops += operations(backend, rows, weights, old=not args.no_old and name != "mlx")
    # MLX apart: its CPU threads linger after an evaluation and would slow whatever runs next
    results = measure([op for op in ops if op[0] != "mlx"], rows, args.repeat)
    results += measure([op for op in ops if op[0] == "mlx"], rows, args.repeat)
    rate = statistics.median(r["copy_bytes_per_s"] for r in results)
    single = statistics.median(r["single_copy_bytes_per_s"] for r in results)
    threaded = statistics.median(r["threaded_copy_bytes_per_s"] for r in results)
    print(
        f"{args.m} fp32 deltas of {args.mb:g} MB ({rows.nbytes / 1e9:.2f} GB of input), kernel threads {threads}, "
        f"{args.repeat} runs each, medians"
    )
    print(
        f"copy of {rows.nbytes / 1e9:.2f} GB: {single / 1e9:.2f} GB/s with one thread, {threaded / 1e9:.2f} GB/s with "
        f"{copy_threads()} (one per core); each run is divided by the faster copy timed right before it\n"
    )
    header = f"{'backend':8} {'operation':18} {'seconds':>9} {'GB/s in':>8} {'× copy':>7} {'× 1-thread':>10} {'× threads':>9}"
    print(header)
    print("-" * len(header))
    verdicts = []
    for r in results:
        print(
            f"{r['backend']:8} {r['operation']:18} {r['seconds']:9.4f} {r['gb_per_s']:8.2f} {r['ratio_to_copy']:7.2f} "
            f"{r['ratio_to_single_copy']:10.2f} {r['ratio_to_threaded_copy']:9.2f}"
        )
        threshold = TARGETS.get(r["operation"]) if r["backend"] in ("numpy", "torch") else None
        if threshold is not None:
            verdicts.append(
                verdict(
                    f"{r['backend']} {r['operation']} ≥ {threshold:g}× the copy rate (the faster of 1 thread and 1 per core)",
                    r["ratios_to_copy"],
                    at_least(threshold),
                    detail=f"{r['ratio_to_single_copy']:.2f}× one thread's copy",
                )
            )
    print()
    for v in verdicts:
        print(v.line("{:.2f}×"))
    met, missed, information = judged(verdicts)
    print(f"\n{met} met, {missed} not met, {information} information only")
    seconds = {(r["backend"], r["operation"]): r["seconds"] for r in results}
    round_costs = {}
    for name in names:
        if (name, "outer step") in seconds and (name, "RDA, norms given") in seconds:
            share = seconds[(name, "outer step")] / seconds[(name, "RDA, norms given")]
            round_costs[name] = share
            print(f"{name}: the outer step takes {share:.2f}× the round's merge pass (RDA, norms given; informational)")
    path = save_result(
        "merge",
        args.json,
        threads,
        {
            "deltas": args.m,
            "mb_per_delta": args.mb,
            "repeat": args.repeat,
            "copy_bytes_per_s": rate,
            "single_copy_bytes_per_s": single,
            "threaded_copy_bytes_per_s": threaded,
            "results": results,
            "targets": [v.as_json() for v in verdicts],
            "all_met": missed == 0 and information == 0,
            "outer_step_over_merge_pass": round_costs,
        },
    )
    print(f"result: {path}")
    return 0 if math.isfinite(rate) else 1


if __name__ == "__main__":
    raise SystemExit(main())
