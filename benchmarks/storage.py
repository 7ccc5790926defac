"""Storage of a long run, with the default retention against keeping everything, side by side.

    python -m benchmarks.storage [--rounds 300] [--learners 3] [--model-mb 1.75]

One fragment of a float32 model of ``--model-mb`` MB, ``--learners`` contributions per round
(small random deltas published through ``RunStore``, as learners do), an in-process syncer
closing each round on a directory mailbox. Two runs: the default ``gm.Retention()`` and one
that keeps every version (what every run did before retention existed). Every 25 rounds it
prints the bytes each run stores, as a multiple of the model, and at the end how long finding
the newest version takes from the head pointer against listing every round record.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import gradientmail as gm
from gradientmail.backends import get_backend
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, RunStore
from gradientmail.syncer import SyncerRuntime

ROOT = Path(__file__).resolve().parent.parent
STEPS = 10
SAMPLES = 80


def stored_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "~locks" not in p.parts)


def run(workdir: Path, retention: gm.Retention, rounds: int, learners: int, numel: int, every: int) -> dict[str, object]:
    box = gm.FileMailbox(workdir / "box", fsync=False)
    store = RunStore(box)
    backend = get_backend("numpy")
    model = {"layer.weight": np.zeros(numel, np.float32)}
    algorithm = gm.DiLoCo(sync_every=STEPS, quorum_size=learners)
    spec, _ = join_run(store, backend, model, RunProposal(algorithm, lease_ttl_s=10.0, retention=retention), "creator")
    syncer = SyncerRuntime(store, backend, spec, "syncer", poll_interval_s=0.1)
    rng = np.random.default_rng(0)
    samples: list[tuple[int, int]] = []
    for round_ in range(1, rounds + 1):
        base = round_ - 1
        for learner in range(learners):
            delta = {"layer.weight": (1e-3 * rng.standard_normal(numel)).astype(np.float32)}
            store.publish_contribution(f"learner-{learner}", 0, base, delta, ContributionCounts(steps=STEPS, samples=SAMPLES))
        for _ in range(20):
            syncer.run_once()
            if store.newest_version(0, known=base) == round_:
                break
        else:
            raise RuntimeError(f"round {round_} did not commit")
        if round_ % every == 0 or round_ == rounds:
            samples.append((round_, stored_bytes(workdir / "box")))
    syncer.stop(resign=True)
    started = time.perf_counter()
    for _ in range(20):
        store.newest_version(0)
    from_head = (time.perf_counter() - started) / 20
    started = time.perf_counter()
    for _ in range(20):
        store.committed_versions(0)
    listing = (time.perf_counter() - started) / 20
    kept = len(store.committed_versions(0))
    box.close()
    return {"samples": samples, "newest_from_head_s": from_head, "listing_s": listing, "round_records": kept}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--learners", type=int, default=3)
    parser.add_argument("--model-mb", type=float, default=1.75)
    parser.add_argument("--every", type=int, default=25, help="measure every this many rounds")
    args = parser.parse_args(argv)
    numel = int(args.model_mb * 1e6 / 4)
    model_bytes = numel * 4
    with tempfile.TemporaryDirectory() as scratch:
        retained = run(Path(scratch) / "retained", gm.Retention(), args.rounds, args.learners, numel, args.every)
        everything = run(
            Path(scratch) / "everything",
            gm.Retention(keep_versions=10**9, audit_rounds=10**9 - 1),
            args.rounds,
            args.learners,
            numel,
            args.every,
        )
    print(f"storage of a {model_bytes / 1e6:.2f} MB fp32 model, {args.learners} learners per round, one fragment")
    print(f"{'round':>6} {'default retention':>20} {'keep everything':>18} {'ratio':>7}")
    for (round_, kept), (_, full) in zip(retained["samples"], everything["samples"], strict=True):  # type: ignore[call-overload]
        print(
            f"{round_:>6} {kept / 1e6:>11.1f} MB {kept / model_bytes:>5.0f}× "
            f"{full / 1e6:>9.1f} MB {full / model_bytes:>4.0f}× {kept / full:>7.3f}"
        )
    half = [b for r, b in retained["samples"] if r >= args.rounds // 2]  # type: ignore[union-attr]
    flat = max(half) / min(half) if half else float("nan")
    print(f"default retention, second half of the run: max/min stored = {flat:.2f} (flat ≈ 1)")
    print(
        f"finding the newest version: head pointer {retained['newest_from_head_s'] * 1e3:.2f} ms "  # type: ignore[operator]
        f"({retained['round_records']} records kept); listing {everything['round_records']} records "
        f"{everything['listing_s'] * 1e3:.2f} ms"  # type: ignore[operator]
    )
    out = ROOT / "runs" / f"storage-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    result = {"model_bytes": model_bytes, "retained": retained, "everything": everything, "second_half_flatness": flat}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {out / 'result.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
