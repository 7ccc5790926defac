"""Iso-C's exact form against its fast form on one large matrix (issue 14).

    python -m benchmarks.iso_c [--rows 1024] [--cols 4096] [--repeat 3] [--backends numpy] [--json PATH]

For each backend (PyTorch host tensors run the NumPy kernels, so ``--backends torch`` times
the same code; its torch-ops path is for accelerator tensors) it times, in ``--repeat`` interleaved pairs,
``gm.IsoC(form="exact")`` (float64 SVD) and ``gm.IsoC(form="fast")`` (6 quintic + 3 cubic
Newton–Schulz steps in fp32, the defaults) on one ``--rows``×``--cols`` fp32 matrix whose
singular values decay as k^-0.5, and prints the time ratio against the issue's target (fast
≥ 10× faster, on the median of ``--repeat`` interleaved pairs). Accuracy, on the first
backend: the relative Frobenius difference ‖fast − exact‖/‖exact‖ of the isotropic tensors
(direction times scale) on three spectra — flat-ish (a Gaussian matrix), k^-0.5 and k^-1 —
for both fast scales (``"mean"``: ⟨O, Δ⟩/‖O‖²; ``"rms"``: the paper's ‖Δ‖_F/√min(m, n)), and
for Muon's quintic steps alone (``polish_steps=0``). The issue's quality bound (loss within
0.2 % of exact) needs training runs (benchmarks/quality.py); this measures the merge itself.
A JSON result goes to ``--json`` (default ``runs/iso-c-<UTC time>/result.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
from pathlib import Path
from typing import Any

import numpy as np

import gradientmail as gm
from benchmarks.targets import at_least, verdict
from benchmarks.timing import best_of
from gradientmail.backends import Backend, get_backend
from gradientmail.errors import BackendUnavailable

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 10.0


def spectrum_matrix(rows: int, cols: int, decay: float | None, seed: int = 0) -> np.ndarray:
    """fp32 ``rows``×``cols``: Gaussian when ``decay`` is None, else singular values k^-decay."""
    rng = np.random.default_rng(seed)
    if decay is None:
        return rng.standard_normal((rows, cols), dtype=np.float32)
    rank = min(rows, cols)
    left, _ = np.linalg.qr(rng.standard_normal((rows, rank)))
    right, _ = np.linalg.qr(rng.standard_normal((cols, rank)))
    sigma = (1.0 + np.arange(rank)) ** -decay
    return ((left * sigma) @ right.T).astype(np.float32)


def isotropic(backend: Backend, merge: gm.IsoC, tensor: Any) -> np.ndarray:
    direction, scale = merge.isotropic(backend, tensor)
    return np.asarray(backend.to_numpy(direction), np.float64) * scale


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved exact/fast pairs; the median ratio decides")
    parser.add_argument("--backends", default="numpy")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    exact, fast = gm.IsoC(form="exact"), gm.IsoC(form="fast")
    timed = spectrum_matrix(args.rows, args.cols, 0.5)
    timings = []
    backends: list[Backend] = []
    for name in args.backends.split(","):
        try:
            backend = get_backend(name.strip())
        except BackendUnavailable as error:
            print(f"{name}: skipped ({error})")
            continue
        backends.append(backend)
        warm = backend.from_numpy(spectrum_matrix(64, 256, 0.5))  # the first LAPACK/BLAS call starts threads
        exact.isotropic(backend, warm)
        fast.isotropic(backend, warm)
        tensor = backend.from_numpy(timed)
        pairs = [  # interleaved: a busy spell slows both forms of the same pair
            (best_of(1, lambda: exact.isotropic(backend, tensor)), best_of(1, lambda: fast.isotropic(backend, tensor)))
            for _ in range(args.repeat)
        ]
        judged = verdict(
            f"{backend.name} fast Iso-C ≥ {TARGET_RATIO:g}× faster than exact ({args.rows}×{args.cols})",
            [e / f for e, f in pairs],
            at_least(TARGET_RATIO),
        )
        exact_s, fast_s = statistics.median(e for e, _ in pairs), statistics.median(f for _, f in pairs)
        timings.append({"backend": backend.name, "exact_s": exact_s, "fast_s": fast_s, **judged.as_json()})
        print(f"{backend.name:6s} {args.rows}×{args.cols}: exact {exact_s:.3f} s, fast {fast_s:.3f} s (medians)")
        print(f"  {judged.line('{:.1f}×')}")

    accuracy = []
    if backends:
        backend = backends[0]
        variants = {
            "fast, mean scale": fast,
            "fast, rms scale (paper)": gm.IsoC(form="fast", fast_scale="rms"),
            "quintic only, mean scale": gm.IsoC(form="fast", polish_steps=0),
        }
        for label, decay in (("gaussian", None), ("k^-0.5", 0.5), ("k^-1", 1.0)):
            matrix = timed if decay == 0.5 else spectrum_matrix(args.rows, args.cols, decay)
            tensor = backend.from_numpy(matrix)
            reference = isotropic(backend, exact, tensor)
            sigma = np.linalg.svd(matrix.astype(np.float64), compute_uv=False)
            row: dict[str, Any] = {"spectrum": label, "rms_over_mean_sigma": float(np.sqrt(np.mean(sigma**2)) / sigma.mean())}
            for variant, merge in variants.items():
                row[variant] = relative(isotropic(backend, merge, tensor), reference)
            accuracy.append(row)
            print(
                f"{label:9s} RMS(sigma)/mean(sigma) {row['rms_over_mean_sigma']:.3f}: ‖fast − exact‖/‖exact‖ "
                + ", ".join(f"{v} {row[v]:.2e}" for v in variants)
            )

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = args.json or ROOT / "runs" / f"iso-c-{stamp}" / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "iso_c",
        "shape": [args.rows, args.cols],
        "repeat": args.repeat,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "python": platform.python_version()},
        "fast": fast.to_manifest(),
        "target_ratio": TARGET_RATIO,
        "timings": timings,
        "accuracy": accuracy,
        "all_met": bool(timings) and all(t["met"] is True for t in timings),
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
