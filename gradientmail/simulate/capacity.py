"""The capacity sweep: the largest number of learners each syncer layout sustains, against the model's
size, on one NIC and one store (issue 26, part 3).

Every node, the syncer included, gets the same NIC (``nic_bps``): the question is what the layout
does with the same machines. A layout sustains M learners when its busiest node keeps up within a
sync period (:func:`~gradientmail.simulate.bottleneck.sustains`). Writes ``sweep_capacity.json``
and ``sweep_capacity.png``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gradientmail.simulate.bottleneck import busiest_node, egress_usd_per_day, largest_learners
from gradientmail.simulate.model import Model
from gradientmail.simulate.sweep import pyplot

__all__ = ["CAPACITY_FRAGMENTS", "CAPACITY_PARAMS", "capacity_model", "run_capacity"]

CAPACITY_PARAMS: tuple[float, ...] = (0.125e9, 0.35e9, 1e9, 3e9, 8e9, 12e9, 30e9, 70e9)
"""Model sizes swept, in parameters (bf16: two bytes each)."""
CAPACITY_FRAGMENTS = 16
"""P for both layouts: one syncer moves the same bytes whatever P; ``spread`` deals them over min(M, P) nodes."""
LAYOUTS = ("one", "spread")


def capacity_model(base: Model, *, nic_bps: float, params: float, layout: str, fragments: int = CAPACITY_FRAGMENTS) -> Model:
    """``base`` with every node on ``nic_bps``, a bf16 model of ``params`` parameters and the layout."""
    return base.with_(
        learner_bandwidth_bps=nic_bps,
        syncer_bandwidth_bps=nic_bps,
        closer_bandwidth_bps=nic_bps,
        model_bytes=2.0 * params,
        fragments=fragments,
        syncer_layout=layout,
    )


def run_capacity(
    out: Path, *, model: Model | None = None, nic_bps: float = 1.25e9, params: Sequence[float] = CAPACITY_PARAMS
) -> dict[str, Any]:
    """Largest M per layout and model size; write the JSON and the plot into ``out``; return the JSON's content."""
    base = model or Model()
    points = []
    for size in params:
        row: dict[str, Any] = {"params": size, "model_bytes": 2.0 * size}
        for layout in LAYOUTS:
            m = capacity_model(base, nic_bps=nic_bps, params=size, layout=layout)
            largest = largest_learners(m)
            at = max(1, largest)
            node = busiest_node(m, at)
            row[layout] = {
                "largest_learners": largest,
                "busiest_node_gb_per_period": round((node.ingress_bytes + node.egress_bytes) / 1e9, 2),
                "busiest_closing_s": round(node.closing_s, 1),
                "egress_usd_per_day_cross_region": round(egress_usd_per_day(m.with_(egress_usd_per_gb=0.02), at), 0),
            }
        points.append(row)
    data = {
        "sweep": "capacity",
        "nic_gbit_s": nic_bps * 8 / 1e9,
        "fragments": CAPACITY_FRAGMENTS,
        "sync_period_s": base.sync_every * base.step_s,
        "store_latency_s": base.store_latency_s,
        "merge_bytes_per_s": base.merge_bytes_per_s,
        "points": points,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep_capacity.json").write_text(json.dumps(data, indent=1) + "\n")
    _plot(data, out / "sweep_capacity.png")
    return data


def _plot(data: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 5), dpi=100)
    xs = [point["params"] / 1e9 for point in data["points"]]
    for layout, label in (("one", "one syncer"), ("spread", f"spread over the nodes (P = {data['fragments']})")):
        kept = [(x, point[layout]["largest_learners"]) for x, point in zip(xs, data["points"], strict=True)]
        kept = [(x, m) for x, m in kept if m > 0]  # none sustained: one learner cannot move its own model in time
        axis.plot([x for x, _ in kept], [m for _, m in kept], marker="o", label=label)
    axis.set_xscale("log")
    axis.set_yscale("log", base=2)
    axis.set_xlabel("model size (billion parameters, bf16)")
    axis.set_ylabel("largest M the layout sustains (none past the last point)")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    axis.set_title(
        f"{data['nic_gbit_s']:g} Gbit/s per node, sync period {data['sync_period_s']:g} s, store latency "
        f"{data['store_latency_s'] * 1000:g} ms",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
