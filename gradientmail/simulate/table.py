"""Decoupled DiLoCo's Table 1 (goodput under simulated failures), simulated and set beside the paper's.

The two baseline rows calibrate one parameter each (data-parallel: ``dp_restart_s``; elastic
data-parallel: ``stall_s``); the Decoupled DiLoCo rows are predictions, held to ±3 points.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradientmail.simulate.engine import DAY_S, Result, simulate
from gradientmail.simulate.model import Model, System, daly_goodput, elastic_goodput

__all__ = ["PAPER", "TOLERANCE", "Row", "format_table", "json_rows", "table"]

TOLERANCE = 0.03
"""How far (absolute goodput) a simulated row may be from the paper's and still count as reproduced."""

PAPER: tuple[tuple[System, int | None, float], ...] = (
    ("data_parallel", None, 0.27),
    ("elastic_data_parallel", None, 0.58),
    ("decoupled", 2, 0.70),
    ("decoupled", 4, 0.82),
    ("decoupled", 8, 0.88),
    ("decoupled", 16, 0.93),
)
"""Decoupled DiLoCo, Table 1: 1.2 M chips, each interrupted about once a year."""

TABLE_DAYS = 7.0
"""Simulated days per row: a standard error near 0.2 points, in about a second for the table."""


@dataclass(frozen=True)
class Row:
    system: System
    learners: int | None
    paper: float
    result: Result
    closed_form: float
    role: str
    """``calibrated`` (a parameter was fitted to this row) or ``prediction``."""

    @property
    def difference(self) -> float:
        return self.result.goodput - self.paper

    @property
    def within(self) -> bool:
        return abs(self.difference) <= TOLERANCE


def closed_form(model: Model, system: System, learners: int | None) -> float:
    rate = model.failure_rate
    if system == "data_parallel":
        return daly_goodput(rate, model.checkpoint_interval_s, model.dp_checkpoint_cost_s, model.dp_restart_s)
    units = 1 if system == "elastic_data_parallel" else (learners or 1)
    return elastic_goodput(rate, model.stall_s, model.capacity, units)


def table(model: Model | None = None, *, seed: int = 0, days: float = TABLE_DAYS) -> list[Row]:
    model = model or Model()
    rows = []
    for system, learners, paper in PAPER:
        result = simulate(model, system, learners, seed=seed, duration_s=days * DAY_S)
        role = "calibrated" if system != "decoupled" else "prediction"
        rows.append(Row(system, learners, paper, result, closed_form(model, system, learners), role))
    return rows


def _label(system: System, learners: int | None) -> str:
    names = {"data_parallel": "Data-parallel", "elastic_data_parallel": "Elastic data-parallel"}
    return names.get(system, f"Decoupled DiLoCo M={learners}")


def format_table(rows: list[Row], model: Model) -> str:
    lines = [
        f"Goodput, {model.chips:,} chips, one interruption per chip every {model.chip_mtbf_s / 86400:.0f} days "
        f"(cluster: one every {1 / model.failure_rate:.1f} s); {rows[0].result.duration_s / DAY_S:g} simulated days per row",
        f"{'system':<26}{'paper':>7}{'simulated':>14}{'closed form':>13}{'diff':>8}  {'role':<11} verdict   downtime",
    ]
    for row in rows:
        r = row.result
        simulated = f"{100 * r.goodput:5.1f} ±{100 * r.stderr:.1f}"
        verdict = "within ±3" if row.within else "MISSED"
        lines.append(
            f"{_label(row.system, row.learners):<26}{100 * row.paper:>6.0f}%{simulated:>13}%{100 * row.closed_form:>12.1f}%"
            f"{100 * row.difference:>+7.1f}   {row.role:<11} {verdict:<9} {100 * r.global_downtime:5.2f}%"
        )
    lines.append(
        "calibrated: data-parallel fits dp_restart_s, elastic data-parallel fits stall_s; "
        "the Decoupled DiLoCo rows are predictions. downtime: share of time no unit trains (global downtime)."
    )
    return "\n".join(lines)


def json_rows(rows: list[Row]) -> list[dict[str, object]]:
    """The simulated rows only, as ``gradientmail simulate --table --json`` prints them."""
    return [{"system": row.system, "learners": row.learners, "goodput": round(row.result.goodput, 4)} for row in rows]
