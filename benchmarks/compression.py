"""Lossless compression of what a run moves (byte-shuffled zstd) against the copy rate and the lossy codecs.

    python -m benchmarks.compression [--width 512] [--layers 4] [--steps 20] [--repeat 3]

The guide's own system compresses payloads with byte-shuffled zstd and reports 16 % fewer bytes
for fp32 and 31 % for bf16. Before offering it here, this measures it on what a run really moves:
the demo GPT (``--layers`` × ``--width``) trained ``--steps`` AdamW steps from its initial
parameters on the demo corpus, and of it

* the pseudo-gradient (initial − trained), fp32 and bf16 (what ``delta_dtype="bfloat16"`` sends);
* the parameters (a commit, a checkpoint), fp32 and bf16.

Each, concatenated into one buffer per dtype, goes through Blosc (``numcodecs``, the codec zarr
uses) with zstd at levels 1 and 3, byte shuffle with the dtype's size, one thread per core; and,
as the reference without the shuffle, zstd level 1 alone. Printed per form and codec: compressed
÷ raw size, compress and decompress rates ÷ the copy rate of the same buffer (the faster of one
thread and one per core, timed right before each run, ``benchmarks/timing.py``), medians of
``--repeat`` runs; beside them the bytes of the lossy codecs the library has (int8 and int4 per
128 elements, top-64-of-4096 int2), and the link speed below which compressing pays: bytes saved
÷ (compress + decompress seconds). No targets: the issue asks whether it pays, and where.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

import ml_dtypes
import numpy as np
import torch

from benchmarks.targets import information
from benchmarks.timing import against_copy, save_result
from demo import model as torch_gpt
from demo.data import BatchSampler, load_corpus
from demo.model_config import GPTConfig
from gradientmail.backends.quantize import Codec
from gradientmail.backends.sparse import SparseCodec

FORMS = ("delta fp32", "delta bf16", "params fp32", "params bf16")
LOSSY = {"int8/128": Codec("int8"), "int4/128": Codec("int4"), "top64of4096/int2": SparseCodec(64)}


def trained_tensors(width: int, layers: int, steps: int) -> dict[str, np.ndarray]:
    """The four forms measured, each as one flat buffer: deltas and parameters, fp32 and bf16."""
    config = GPTConfig(width=width, layers=layers, heads=max(1, width // 64))
    model = torch_gpt.GPT(config, seed=0)
    initial = {name: value.copy() for name, value in model.to_numpy().items()}
    optimizer = torch_gpt.make_optimizer(model, 1e-3)
    sampler = BatchSampler(load_corpus().train, 16, config.context, seed=1)
    for _ in range(steps):
        torch_gpt.train_step(model, optimizer, sampler.next())
    trained = model.to_numpy()
    delta = np.concatenate([(initial[name] - trained[name]).reshape(-1) for name in trained])
    params = np.concatenate([value.reshape(-1) for value in trained.values()])
    forms = (delta, delta.astype(ml_dtypes.bfloat16), params, params.astype(ml_dtypes.bfloat16))
    return dict(zip(FORMS, forms, strict=True))


def codecs(threads: int) -> dict[str, Any]:
    """Name → a codec (numcodecs' Blosc; ``zstd`` alone as the reference). Blosc shuffles by the
    element size of the array it is handed, so each form goes in as unsigned words of its own
    width (what ``backends/lossless.py`` does; numcodecs' ``typesize=`` needs 0.15, which has no
    Python 3.10 wheels)."""
    from numcodecs import Blosc, Zstd, blosc

    blosc.set_nthreads(threads)
    blosc.use_threads = True  # also from the main thread of a process that runs others
    return {
        "blosc zstd-1 shuffle": Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE),
        "blosc zstd-3 shuffle": Blosc(cname="zstd", clevel=3, shuffle=Blosc.SHUFFLE),
        "zstd-1, no shuffle": Zstd(level=1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    forms = trained_tensors(args.width, args.layers, args.steps)
    made = codecs(threads)
    numel = forms["delta fp32"].size
    print(f"demo GPT {args.layers} × {args.width}: {numel:,} parameters, {args.steps} AdamW steps; {threads} threads")
    header = f"{'form':12} {'codec':22} {'÷ raw':>7} {'compress × copy':>16} {'decompress × copy':>18} {'pays below':>11}"
    print(header + "\n" + "-" * len(header))
    rows, verdicts = [], []
    for form, array in forms.items():
        raw = array.view(np.uint8)
        words = array.view(f"u{array.dtype.itemsize}")
        for name, codec in made.items():
            packed = codec.encode(words)
            assert bytes(codec.decode(packed)) == raw.tobytes(), f"{name} did not round-trip {form}"
            timed = against_copy([lambda: codec.encode(words), lambda: codec.decode(packed)], raw, args.repeat)
            ratio = len(packed) / raw.nbytes
            comp = statistics.median(timed[0].ratios(raw.nbytes, raw.nbytes))
            decomp = statistics.median(timed[1].ratios(raw.nbytes, raw.nbytes))
            seconds = timed[0].median_seconds() + timed[1].median_seconds()
            pays_below = (raw.nbytes - len(packed)) / seconds  # bytes per second of link
            print(f"{form:12} {name:22} {ratio:7.3f} {comp:16.2f} {decomp:18.2f} {pays_below / 1e6:8.0f} MB/s")
            rows.append(
                {
                    "form": form,
                    "codec": name,
                    "ratio": ratio,
                    "compress_x_copy": comp,
                    "decompress_x_copy": decomp,
                    "seconds": seconds,
                    "pays_below_bytes_per_s": pays_below,
                    "raw_bytes": raw.nbytes,
                }
            )
            verdicts.append(information(f"{form}, {name}: compressed ÷ raw", ratio))
    print("\nlossy codecs of the library, bytes ÷ fp32 (for the deltas):")
    for name, lossy in LOSSY.items():
        print(f"  {name:18} {lossy.nbytes(numel) / (4 * numel):.4f}")
    path = save_result(
        "compression", None, threads, {"args": vars(args), "rows": rows, "targets": [v.as_json() for v in verdicts]}
    )
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
