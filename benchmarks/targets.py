"""Verdicts that cannot flatter: the one place a benchmark's target is called met or not.

A figure decides a target only when it is the median of at least ``MIN_RUNS`` runs (seeds, for
a quality arm) taken at the shipped defaults (or at the setting the target itself names, such
as the lock-step settings of a quality reference). Anything else is printed as information,
with the runs and the setting it came from, never as met. Every benchmark prints its targets
through :func:`verdict`, and ``tests/test_benchmark_targets.py`` fails when one prints "met" on
its own.

    v = verdict("whole round ≤ 1.3× the boto3 floor", ratios, at_most(1.3))
    print(v.line())          # "[met] ... median 1.21× (1.10–1.35, 3 runs)" or "[information: ...]"
    result["targets"].append(v.as_json())
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MIN_RUNS = 3
"""Runs (or seeds) a verdict needs; fewer are printed as information."""
DEFAULTS = "defaults"
"""The setting every verdict is taken at unless the target names its own."""
MET, MISSED = "[met]", "[NOT MET]"
"""The only spellings of a verdict; a suite collects the lines that say ``MISSED``."""


@dataclass(frozen=True)
class Verdict:
    """One target judged on its figures, with where they came from."""

    target: str
    figures: tuple[float, ...]
    met: bool | None
    """None: information only (too few runs, another setting, or nothing measured)."""
    runs: int
    setting: str
    why: str = ""
    """Why there is no verdict, when there is none."""
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    is_check: bool = False
    """A pass/fail condition (:func:`check`): its one figure is 1 (passed) or 0 (failed)."""

    @property
    def median(self) -> float | None:
        return statistics.median(self.figures) if self.figures else None

    def line(self, fmt: str = "{:.3g}") -> str:
        """``[met] target: median (min–max, n runs) detail`` or the information it is instead."""
        plural = "s" if self.runs != 1 else ""
        if self.is_check and self.figures:
            figure = f"{'passed' if self.figures[0] else 'failed'} ({self.runs} run{plural})"
        elif self.figures:
            spread = f"{fmt.format(min(self.figures))}–{fmt.format(max(self.figures))}, " if len(self.figures) > 1 else ""
            figure = f"median {fmt.format(self.median)} ({spread}{self.runs} run{plural})"
        else:
            figure = "not measured"
        state = MET if self.met else MISSED if self.met is False else f"[information: {self.why}]"
        setting = "" if self.setting == DEFAULTS else f", at {self.setting}"
        detail = f"; {self.detail}" if self.detail else ""
        return f"{state} {self.target}: {figure}{setting}{detail}"

    def as_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "met": self.met,
            "median": self.median,
            "figures": list(self.figures),
            "runs": self.runs,
            "setting": self.setting,
            "why": self.why,
            **self.extra,
        }


def at_least(bound: float) -> Callable[[float], bool]:
    """``ok`` for a target that a figure meets by reaching ``bound``."""
    return lambda figure: figure >= bound


def at_most(bound: float) -> Callable[[float], bool]:
    """``ok`` for a target that a figure meets by staying within ``bound``."""
    return lambda figure: figure <= bound


def within(tolerance: float, of: float = 1.0) -> Callable[[float], bool]:
    """``ok`` for a target that a figure meets by staying within ``tolerance`` (a share) of ``of``."""
    return lambda figure: abs(figure - of) <= tolerance * abs(of)


def verdict(
    target: str,
    figures: Sequence[float] | float | None,
    ok: Callable[[float], bool],
    *,
    setting: str = DEFAULTS,
    judged_at: str = DEFAULTS,
    runs: int | None = None,
    detail: str = "",
    **extra: Any,
) -> Verdict:
    """Judge ``target`` on the median of ``figures`` (one per run) with ``ok``.

    ``setting``: what the figures were measured at; ``judged_at``: the setting the target is
    defined at (the defaults unless the target names another). A verdict is given only when
    they agree and there are at least ``MIN_RUNS`` runs (``runs`` overrides the count when one
    figure already summarises several runs, e.g. a ratio of medians).
    """
    values = () if figures is None else (float(figures),) if isinstance(figures, (int, float)) else tuple(map(float, figures))
    count = len(values) if runs is None else runs
    why = ""
    if not values:
        why = "not measured"
    elif count < MIN_RUNS:
        why = f"{count} run{'s' if count != 1 else ''}, a verdict needs {MIN_RUNS}"
    elif setting != judged_at:
        why = f"measured at {setting}, the target is at {judged_at}"
    met = ok(statistics.median(values)) if not why else None
    return Verdict(target, values, met, count, setting, why, detail, dict(extra))


def check(
    target: str,
    passed: bool | None,
    *,
    runs: int = 1,
    setting: str = DEFAULTS,
    judged_at: str = DEFAULTS,
    detail: str = "",
) -> Verdict:
    """A pass/fail condition (nothing lost, every fault named) rather than a figure. A failure
    is a miss in any run at any setting; a pass is a verdict only with ``MIN_RUNS`` passing runs
    at the target's setting (``passed`` says every one of ``runs`` passed)."""
    if passed is None:
        return Verdict(target, (), None, runs, setting, "not applicable", detail, is_check=True)
    if not passed:
        return Verdict(target, (0.0,), False, runs, setting, "", detail, is_check=True)
    why = ""
    if runs < MIN_RUNS:
        why = f"{runs} run{'s' if runs != 1 else ''}, a pass needs {MIN_RUNS}"
    elif setting != judged_at:
        why = f"measured at {setting}, the target is at {judged_at}"
    return Verdict(target, (1.0,), None if why else True, runs, setting, why, detail, is_check=True)


def conditions(
    pairs: Sequence[tuple[str, bool | None]], *, runs: int, setting: str = DEFAULTS, judged_at: str = DEFAULTS
) -> list[Verdict]:
    """Targets stated as ``(text with its figure, whether it holds)`` (the quality arms, the chaos
    run), as :func:`check` verdicts: a miss is a miss, a pass needs ``MIN_RUNS`` runs (seeds)."""
    return [check(text, passed, runs=runs, setting=setting, judged_at=judged_at) for text, passed in pairs]


def within_noise(
    target: str, figures: Sequence[float], reference: Sequence[float], *, no_worse: bool = False, setting: str = DEFAULTS
) -> Verdict:
    """An arm against a reference run beside it in the same repeats: the difference of their
    medians judged against the run-to-run noise, the larger of the two spreads over repeats
    (``no_worse``: only a higher figure, a loss say, counts against the arm). A pass needs
    ``MIN_RUNS`` repeats of both; one repeat has no noise to judge against."""
    runs = min(len(figures), len(reference))
    if runs < 2:
        return check(target, None, detail="one repeat: no run-to-run noise to judge against")
    noise = max(max(figures) - min(figures), max(reference) - min(reference))
    difference = statistics.median(figures) - statistics.median(reference)
    held = difference <= noise if no_worse else abs(difference) <= noise
    text = f"{target}: medians {difference:+.4f} apart, run-to-run noise {noise:.4f}"
    return check(text, held, runs=runs, setting=setting)


def information(target: str, figures: Sequence[float] | float, why: str = "a reference, not a target", **extra: Any) -> Verdict:
    """A figure printed beside the targets that no verdict is taken on."""
    values = (float(figures),) if isinstance(figures, (int, float)) else tuple(map(float, figures))
    return Verdict(target, values, None, len(values), DEFAULTS, why, "", dict(extra))


def judged(verdicts: Sequence[Verdict]) -> tuple[int, int, int]:
    """(met, missed, information only) counts."""
    met = sum(1 for v in verdicts if v.met)
    missed = sum(1 for v in verdicts if v.met is False)
    return met, missed, len(verdicts) - met - missed
