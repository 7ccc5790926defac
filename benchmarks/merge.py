"""Merges and the outer step against the machine's copy rate, side by side in one run (issue 13).

    python -m benchmarks.merge [--mb 256] [--m 8] [--repeat 3] [--json PATH] [--threads N] [--no-old]

``--m`` fp32 deltas of ``--mb`` MB each (one tensor per delta, the fragment of a syncer round).
For the NumPy and PyTorch backends (and MLX when importable, for information) it times, best
of ``--repeat``:

* weighted mean: ``weighted_mean`` (one fused combination);
* RDA standalone: ``rda`` (the norms, then the combination with ‖u‖ in the same pass, then the
  final scale over the output);
* RDA, norms given: ``rda_unscaled`` with the norms validation measured (the syncer's round:
  one combination pass, the scale left to the outer step);
* outer step: ``Backend.outer_update`` on one delta-sized fp32 tensor with the scale folded in
  (reads θ, m, Δ once, writes θ' and m');
* finite_norm: the validation pass over every delta (finiteness and norm together).

Throughput is bytes of input per second (the M deltas; θ, m and Δ for the outer step), and
each figure is divided by ``np.copyto``'s rate (bytes copied per second) from the deltas into
a buffer of the merge's input size, measured in the same run: a copy is timed right before
every timed run of an operation, so both see the same machine, and each side keeps its best.
Targets (issue 13), each printed as met or NOT MET: weighted mean ≥ 0.5× copy; RDA
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.timing import best_against_copy, save_result
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
    """Best seconds of every operation, and the best of the np.copyto runs timed right before
    its own runs (as many copies as runs, so a busy machine weighs on both sides alike)."""
    if not ops:
        return []
    timed = best_against_copy([action for _, _, _, action in ops], rows, repeat)
    return [
        {
            "backend": name,
            "operation": op,
            "seconds": seconds,
            "input_bytes": nbytes,
            "copy_bytes_per_s": rows.nbytes / copy,
            "gb_per_s": nbytes / seconds / 1e9,
            "ratio_to_copy": (nbytes / seconds) / (rows.nbytes / copy),
        }
        for (name, op, nbytes, _), (seconds, copy) in zip(ops, timed, strict=True)
    ]


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
    rate = max(r["copy_bytes_per_s"] for r in results)
    print(
        f"{args.m} fp32 deltas of {args.mb:g} MB ({rows.nbytes / 1e9:.2f} GB of input), kernel threads {threads}, "
        f"best of {args.repeat}"
    )
    print(f"np.copyto of {rows.nbytes / 1e9:.2f} GB: {rate / 1e9:.2f} GB/s copied (best; each row uses its own copies)\n")
    header = f"{'backend':8} {'operation':18} {'seconds':>9} {'GB/s in':>8} {'× copy':>7}  target"
    print(header)
    print("-" * len(header))
    targets = []
    for r in results:
        threshold = TARGETS.get(r["operation"]) if r["backend"] in ("numpy", "torch") else None
        verdict = ""
        if threshold is not None:
            met = r["ratio_to_copy"] >= threshold
            verdict = f"≥ {threshold:g}×: {'met' if met else 'NOT MET'}"
            targets.append(
                {
                    "backend": r["backend"],
                    "operation": r["operation"],
                    "ratio": r["ratio_to_copy"],
                    "threshold": threshold,
                    "met": met,
                }
            )
        print(
            f"{r['backend']:8} {r['operation']:18} {r['seconds']:9.4f} {r['gb_per_s']:8.2f} {r['ratio_to_copy']:7.2f}  {verdict}"
        )
    missed = [t for t in targets if not t["met"]]
    print()
    for t in targets:
        state = "met" if t["met"] else "NOT MET"
        print(f"target {t['backend']} {t['operation']}: {t['ratio']:.2f}× copy (≥ {t['threshold']:g}×) {state}")
    print(f"\n{len(targets) - len(missed)}/{len(targets)} targets met")
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
            "results": results,
            "targets": targets,
            "all_met": not missed,
            "outer_step_over_merge_pass": round_costs,
        },
    )
    print(f"result: {path}")
    return 0 if math.isfinite(rate) else 1


if __name__ == "__main__":
    raise SystemExit(main())
