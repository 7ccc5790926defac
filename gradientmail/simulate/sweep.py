"""Sweeps: goodput, S3 requests per second and dollars per day against one protocol parameter.

Each sweep runs Decoupled DiLoCo over the values of one parameter, with every other parameter at
:class:`Model`'s defaults (M = 8 learners where M is not the swept one), twice: with elastic learners
(the table's model) and with learners that restart from the committed fragments. It writes
``sweep_<name>.json`` (the points) and ``sweep_<name>.png`` (one figure) into the output folder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gradientmail.errors import GradientMailError, install_hint
from gradientmail.simulate.engine import DAY_S, simulate
from gradientmail.simulate.model import PRICES_AS_OF, Model

__all__ = ["SWEEPS", "run_sweep"]

SWEEP_LEARNERS = 8
SWEEPS: dict[str, tuple[str, str, tuple[float, ...]]] = {
    "M": ("learners", "learners M", (1, 2, 4, 8, 16, 32, 64)),
    "H": ("sync_every", "inner steps per exchange H", (25, 50, 100, 200, 400, 800)),
    "fragments": ("fragments", "fragments P", (1, 2, 4, 8, 16, 32)),
    "quorum": ("quorum_size", "quorum K (M = 8)", (1, 2, 3, 4, 5, 6, 7, 8)),
    "latency": ("store_latency_s", "object-store latency per request (s)", (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)),
}
"""name: (the Model field or ``learners``, the axis label, the values)."""

VARIANTS = (("elastic learners", False), ("restart from committed", True))


def _point(model: Model, learners: int, seed: int, days: float) -> dict[str, Any]:
    result = simulate(model, "decoupled", learners, seed=seed, duration_s=days * DAY_S)
    assert result.requests is not None
    return {
        "goodput": round(result.goodput, 4),
        "stderr": round(result.stderr, 4),
        "waiting": round(result.waiting, 4),
        "global_downtime": round(result.global_downtime, 4),
        "requests_per_s": round(result.requests.per_s, 2),
        "put_per_s": round(result.requests.put_per_s, 2),
        "get_per_s": round(result.requests.get_per_s, 2),
        "usd_per_day": round(result.requests.usd_per_day, 2),
        "commit_latency_s": round(result.extra["commit_latency_s"], 2),
    }


def run_sweep(
    name: str,
    out: Path,
    *,
    model: Model | None = None,
    seed: int = 0,
    days: float = 2.0,
    values: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Run sweep ``name``, write its JSON and PNG into ``out``, return the JSON's content."""
    if name not in SWEEPS:
        raise ValueError(f"unknown sweep {name!r}; one of {', '.join(SWEEPS)}")
    base = model or Model()
    field, label, defaults = SWEEPS[name]
    points = []
    for value in values if values is not None else defaults:
        learners = int(value) if field == "learners" else SWEEP_LEARNERS
        row: dict[str, Any] = {field: value}
        for variant, restart in VARIANTS:
            changes: dict[str, Any] = {"restart_from_committed": restart}
            if field in ("sync_every", "fragments", "quorum_size"):
                changes[field] = int(value)
            elif field != "learners":
                changes[field] = float(value)
            row[variant] = _point(base.with_(**changes), learners, seed, days)
        points.append(row)
    data = {
        "sweep": name,
        "parameter": field,
        "learners": None if field == "learners" else SWEEP_LEARNERS,
        "days": days,
        "seed": seed,
        "prices": PRICES_AS_OF,
        "points": points,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"sweep_{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    _plot(data, label, out / f"sweep_{name}.png")
    return data


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend, or a clear error naming the extra that brings it."""
    try:
        import matplotlib
    except ImportError as exc:  # an optional dependency (the bench extra)
        raise GradientMailError(f"the sweep plots need matplotlib: {install_hint('bench')}") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot(data: dict[str, Any], label: str, path: Path) -> None:
    plt = pyplot()
    field = data["parameter"]
    xs = [point[field] for point in data["points"]]
    figure, (left, right) = plt.subplots(1, 2, figsize=(8, 5), dpi=100)
    for variant, _ in VARIANTS:
        left.plot(xs, [100 * point[variant]["goodput"] for point in data["points"]], marker="o", label=variant)
    left.set_xlabel(label)
    left.set_ylabel("goodput (%)")
    left.set_ylim(0, 100)
    left.legend(loc="lower right", fontsize=8)
    left.grid(alpha=0.3)
    variant = VARIANTS[0][0]
    right.plot(xs, [point[variant]["requests_per_s"] for point in data["points"]], marker="o", color="tab:green")
    right.set_xlabel(label)
    right.set_ylabel("S3 requests / s", color="tab:green")
    cost = right.twinx()
    cost.plot(xs, [point[variant]["usd_per_day"] for point in data["points"]], marker="s", color="tab:red")
    cost.set_ylabel("S3 request cost, $ / day", color="tab:red")
    for axis in (left, right):
        if data["sweep"] in ("M", "H", "fragments", "latency"):
            axis.set_xscale("log")
            axis.set_xticks(xs, [f"{x:g}" for x in xs])
            axis.minorticks_off()
    right.grid(alpha=0.3)
    figure.suptitle(f"Decoupled DiLoCo, sweep of {label} (1.2 M chips, MTBF 1 year/chip)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
