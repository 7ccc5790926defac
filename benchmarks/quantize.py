"""Blockwise quantization (int8, fp8_e4m3, int4, int2) and sparse top-k against the copy rate, with error and size.

    python -m benchmarks.quantize [--mb 256] [--repeat 3] [--block 128] [--threads N] [--json PATH]

One fp32 tensor of ``--mb`` MB of Gaussian values. For each format of
:mod:`gradientmail.backends.quantize` it times, ``--repeat`` runs each:

* quantize: ``quantize(x, codec)`` (codes and per-block scales from the fp32 tensor);
* dequantize: ``dequantize(codes, scales, codec, shape)`` (a fresh fp32 tensor back);
* and for each ``--sparse`` codec (``backends/sparse.py``, default ``top64of4096/int2``) its
  ``sparsify`` (offsets, codes, scales) and ``densify`` (the fresh fp32 tensor), in those rows.

Throughput is bytes of fp32 tensor per second (read by quantize, written by dequantize), and
each run is divided by the copy rate from the tensor into a reused buffer of its size, as in
``benchmarks.merge``: the faster of a one-thread and a one-thread-per-core copy timed right
before it; the verdict takes the median of ``--repeat`` runs. Target (the quantization issue):
quantize and dequantize run at ≥ 0.5× the
copy rate. For information it prints the rate of a copy into a fresh buffer (the first-touch
page faults that dequantize's new tensor pays and the reused buffer does not), the relative
error ‖x − deq‖ / ‖x‖ and the payload bytes per element (codes plus fp32 scales). A JSON
result goes to ``--json`` (default ``runs/quantize-<UTC time>/result.json``).
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.targets import at_least, judged, verdict
from benchmarks.timing import against_copy, best_of, copy_threads, save_result
from gradientmail.backends import kernels
from gradientmail.backends.quantize import DEFAULT_BLOCK, FORMATS, Codec, dequantize, quantize
from gradientmail.backends.sparse import SparseCodec, densify, sparsify

ROOT = Path(__file__).resolve().parent.parent
MB = 1 << 20
TARGET = 0.5
"""quantize and dequantize at ≥ 0.5× the copy rate."""


def measure(ops: list[tuple[str, str, Callable[[], Any]]], x: np.ndarray, repeat: int) -> list[dict[str, Any]]:
    """Every run of every operation against the copies timed right before it (one thread and
    one per core); per-run ratios to the faster copy, and to each copy for information."""
    timed = against_copy([action for _, _, action in ops], x, repeat)
    results = []
    for (form, op, _), runs in zip(ops, timed, strict=True):
        ratios = runs.ratios(x.nbytes, x.nbytes)
        results.append(
            {
                "format": form,
                "operation": op,
                "seconds": runs.median_seconds(),
                "runs_seconds": runs.seconds,
                "fp32_bytes": x.nbytes,
                "copy_bytes_per_s": runs.copy_rate(x.nbytes),
                "single_copy_bytes_per_s": runs.copy_rate(x.nbytes, "single"),
                "threaded_copy_bytes_per_s": runs.copy_rate(x.nbytes, "threaded"),
                "gb_per_s": x.nbytes / runs.median_seconds() / 1e9,
                "ratios_to_copy": ratios,
                "ratio_to_copy": statistics.median(ratios),
                "ratio_to_single_copy": statistics.median(runs.ratios(x.nbytes, x.nbytes, "single")),
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--mb", type=float, default=256, help="MB of fp32 tensor (default 256)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--block", type=int, default=DEFAULT_BLOCK, help=f"elements per scale (default {DEFAULT_BLOCK})")
    parser.add_argument("--threads", type=int, default=None, help="kernel threads (default: the CPUs, at most 8)")
    parser.add_argument(
        "--sparse", default="top64of4096/int2", help="sparse codecs too, comma-separated (backends/sparse.py); '' for none"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads is not None:
        kernels.set_kernel_threads(args.threads)
    threads = kernels.kernel_threads()
    elements = int(args.mb * MB) // 4
    x = np.random.default_rng(0).standard_normal(elements, dtype=np.float32)
    codecs: list[Codec | SparseCodec] = [Codec(form, args.block) for form in FORMATS]  # type: ignore[arg-type]
    codecs += [SparseCodec.parse(name) for name in args.sparse.split(",") if name]
    quality = {}
    norm = float(np.linalg.norm(x.astype(np.float64)))
    ops: list[tuple[str, str, Callable[[], Any]]] = []
    for codec in codecs:
        label = codec.name if isinstance(codec, SparseCodec) else codec.format
        encode: Callable[[], Any]
        decode: Callable[[], np.ndarray]
        if isinstance(codec, SparseCodec):
            parts = sparsify(x, codec)
            encode, decode = functools.partial(sparsify, x, codec), functools.partial(densify, *parts, codec, x.shape)
        else:
            codes, scales = quantize(x, codec)
            encode, decode = functools.partial(quantize, x, codec), functools.partial(dequantize, codes, scales, codec, x.shape)
        deq = decode()
        error = float(np.linalg.norm(x.astype(np.float64) - deq)) / norm
        quality[label] = {"relative_error": error, "bytes_per_element": codec.nbytes(elements) / elements}
        del deq
        ops.append((label, "quantize", encode))
        ops.append((label, "dequantize", decode))
    results = measure(ops, x, args.repeat)
    rate = statistics.median(r["copy_bytes_per_s"] for r in results)
    single = statistics.median(r["single_copy_bytes_per_s"] for r in results)
    threaded = statistics.median(r["threaded_copy_bytes_per_s"] for r in results)
    fresh = x.nbytes / best_of(args.repeat, lambda: np.copyto(np.empty_like(x), x))
    print(
        f"fp32 tensor of {args.mb:g} MB ({elements} Gaussian values), block {args.block}, "
        f"kernel threads {threads}, {args.repeat} runs each, medians"
    )
    print(
        f"copy of {x.nbytes / 1e9:.2f} GB: {single / 1e9:.2f} GB/s with one thread, {threaded / 1e9:.2f} GB/s with "
        f"{copy_threads()} (one per core); each run is divided by the faster copy timed right before it"
    )
    print(
        f"into a fresh buffer (first-touch page faults, as dequantize's new tensor pays): {fresh / 1e9:.2f} GB/s "
        f"({fresh / rate:.2f}× the copy; information)\n"
    )
    header = f"{'format':17} {'operation':10} {'seconds':>8} {'GB/s fp32':>9} {'× copy':>7} {'× 1-thread':>10}"
    print(header)
    print("-" * len(header))
    verdicts = []
    for r in results:
        print(
            f"{r['format']:17} {r['operation']:10} {r['seconds']:8.4f} {r['gb_per_s']:9.2f} {r['ratio_to_copy']:7.2f} "
            f"{r['ratio_to_single_copy']:10.2f}"
        )
        verdicts.append(
            verdict(
                f"{r['format']} {r['operation']} ≥ {TARGET:g}× the copy rate (the faster of 1 thread and 1 per core)",
                r["ratios_to_copy"],
                at_least(TARGET),
                detail=f"{r['ratio_to_single_copy']:.2f}× one thread's copy",
                format=r["format"],
                operation=r["operation"],
            )
        )
    print(f"\n{'format':17} {'‖x − deq‖/‖x‖':>14} {'bytes/element':>14}")
    for form, q in quality.items():
        print(f"{form:17} {q['relative_error']:14.3e} {q['bytes_per_element']:14.4f}")
    print()
    for v in verdicts:
        print(v.line("{:.2f}×"))
    met, missed, information = judged(verdicts)
    print(f"\n{met} targets met, {missed} not met, {information} information only")
    path = save_result(
        "quantize",
        args.json,
        threads,
        {
            "mb": args.mb,
            "elements": elements,
            "block": args.block,
            "repeat": args.repeat,
            "copy_bytes_per_s": rate,
            "single_copy_bytes_per_s": single,
            "threaded_copy_bytes_per_s": threaded,
            "fresh_copy_bytes_per_s": fresh,
            "results": results,
            "quality": quality,
            "targets": [v.as_json() for v in verdicts],
            "all_met": missed == 0 and information == 0,
        },
    )
    print(f"result: {path}")
    return 0 if math.isfinite(rate) else 1


if __name__ == "__main__":
    raise SystemExit(main())
