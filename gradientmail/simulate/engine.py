"""The discrete-event core: a heap of timestamped events, failures sampled up front with a seeded RNG.

Units, not chips: interruptions over the whole cluster are a Poisson process of rate
λ = chips / chip MTBF, and each lands on a unit (the data-parallel job, or one of M learners of
chips/M chips each) with probability proportional to its chips. Goodput is useful chip-time over
total chip-time: a unit contributes its share of chips, times the share of them not out for
repair, while it trains (not stalled, not waiting for a commit).

The round rules come from the library: which step each fragment is published at
(:func:`~gradientmail.algorithms.schedule.first_due_step`), the grace window
(:class:`~gradientmail.syncer.grace.GraceEstimator`, through :meth:`Model.commit_latency_s`), the
syncer's failover bound (INV-6, :attr:`Model.failover_s`), and a contribution's staleness discount
(:func:`~gradientmail.algorithms.merge.staleness_discount`) for the weight a restarted learner's
first contribution carries.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from gradientmail.algorithms.merge import staleness_discount
from gradientmail.algorithms.schedule import first_due_step
from gradientmail.simulate.model import Model, RequestRates, System, request_rates

__all__ = ["Result", "simulate"]

DAY_S = 86400.0
BATCHES = 10
"""The run is cut into this many equal spans; the standard error is that of their means."""


@dataclass(frozen=True)
class Result:
    system: System
    learners: int | None
    goodput: float
    stderr: float
    """Monte-Carlo standard error of ``goodput`` (batch means)."""
    duration_s: float
    failures: int
    global_downtime: float
    """Share of the time no unit trains."""
    waiting: float = 0.0
    """Share of learner time spent waiting for a commit: quorum short or syncer failing over (past the
    overlap window), or every round when the commit takes longer than the overlap (a slow store)."""
    requests: RequestRates | None = None
    contribution_weight: float = 1.0
    """Mean staleness discount of the contributions merged (1: none stale)."""
    extra: dict[str, float] = field(default_factory=dict)


def _failures(model: Model, rng: np.random.Generator, duration_s: float, units: int) -> tuple[np.ndarray, np.ndarray]:
    """Interruption times over the cluster and the unit each hits (vectorised)."""
    count = int(rng.poisson(model.failure_rate * duration_s))
    times = np.sort(rng.uniform(0.0, duration_s, size=count))
    hit = rng.integers(0, units, size=count)
    return times, hit


def simulate(
    model: Model,
    system: System,
    learners: int | None = None,
    *,
    seed: int = 0,
    duration_s: float = DAY_S,
) -> Result:
    """Simulate ``duration_s`` seconds of ``system`` (``learners`` for ``decoupled``)."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be positive, got {duration_s!r}")
    streams = np.random.SeedSequence(seed).spawn(2)
    failure_rng = np.random.default_rng(streams[0])
    syncer_rng = np.random.default_rng(streams[1])
    if system == "data_parallel":
        return _data_parallel(model, failure_rng, duration_s)
    if system == "elastic_data_parallel":
        return _elastic(model, failure_rng, syncer_rng, duration_s, units=1, decoupled=False)
    if learners is None or learners < 1:
        raise ValueError("decoupled needs learners >= 1")
    return _elastic(model, failure_rng, syncer_rng, duration_s, units=learners, decoupled=True)


def _batch_stderr(useful: np.ndarray, span: float) -> float:
    means = useful / span
    return float(np.std(means, ddof=1) / math.sqrt(len(means))) if len(means) > 1 else 0.0


class _Ledger:
    """Useful chip-time (as a share of the cluster), accumulated per batch span."""

    def __init__(self, duration_s: float) -> None:
        self.span = duration_s / BATCHES
        self.useful = np.zeros(BATCHES)

    def add(self, start: float, end: float, rate: float) -> None:
        """Add ``rate`` × the time between ``start`` and ``end`` to the spans it covers."""
        if rate <= 0 or end <= start:
            return
        first = min(int(start // self.span), BATCHES - 1)
        last = min(int(end // self.span), BATCHES - 1)
        for index in range(first, last + 1):
            lo = max(start, index * self.span)
            hi = min(end, (index + 1) * self.span) if index < BATCHES - 1 else end
            if hi > lo:
                self.useful[index] += rate * (hi - lo)

    def remove(self, at: float, amount: float) -> None:
        self.useful[min(int(at // self.span), BATCHES - 1)] -= amount


def _data_parallel(model: Model, rng: np.random.Generator, duration_s: float) -> Result:
    """The whole job stops on every interruption: restart (a failure during it restarts it), then train
    from the last checkpoint, writing one every ``checkpoint_interval_s`` of progress."""
    times, _ = _failures(model, rng, duration_s, 1)
    ledger = _Ledger(duration_s)
    work, cost, restart = model.checkpoint_interval_s, model.dp_checkpoint_cost_s, model.dp_restart_s
    down = 0.0
    t = 0.0
    index = 0
    n = len(times)
    while t < duration_s:
        # train from t (just restarted, or the start) until the next failure
        next_failure = times[index] if index < n else math.inf
        while True:
            end = t + work + cost
            if end <= next_failure and end <= duration_s:
                ledger.add(t, t + work, 1.0)  # the checkpoint commits this segment
                t = end
                continue
            if next_failure >= duration_s and end > duration_s:
                ledger.add(t, duration_s, 1.0)  # the run ends before the next checkpoint: count it
                t = duration_s
                break
            t = next_failure  # work since the last checkpoint is lost
            index += 1
            break
        if t >= duration_s:
            break
        # restart: R seconds with no failure in them
        while True:
            next_failure = times[index] if index < n else math.inf
            if t + restart <= next_failure:
                down += min(t + restart, duration_s) - t
                t += restart
                break
            down += next_failure - t
            t = next_failure
            index += 1
            if t >= duration_s:
                break
    goodput = float(ledger.useful.sum() / duration_s)
    return Result(
        system="data_parallel",
        learners=None,
        goodput=goodput,
        stderr=_batch_stderr(ledger.useful, ledger.span),
        duration_s=duration_s,
        failures=n,
        global_downtime=1.0 - goodput,
    )


@dataclass
class _Unit:
    stalled_until: float = 0.0
    out_slices: int = 0
    waiting: bool = False
    wait_epoch: int = -1
    steps: float = 0.0
    """Steps trained since the unit last aligned (its place on the fragment staircase)."""
    stale: int = 0
    """Versions its next contribution is behind (after a restart from an older commit)."""

    def running(self, t: float) -> bool:
        return t >= self.stalled_until and not self.waiting


def _lost_work_s(model: Model, steps: float) -> float:
    """Seconds of training lost by a restart from the committed fragments: for each fragment, the steps
    since its last publish on the library's staircase (``first_due_step`` then every H), averaged."""
    h, p = model.sync_every, model.fragments
    ages = []
    for fragment in range(p):
        first = first_due_step(fragment, p, h)
        ages.append(steps if steps < first else (steps - first) % h)
    return float(np.mean(ages)) * model.step_s


def _elastic(
    model: Model,
    failure_rng: np.random.Generator,
    syncer_rng: np.random.Generator,
    duration_s: float,
    *,
    units: int,
    decoupled: bool,
) -> Result:
    """Elastic data-parallel (one unit, no syncer) or Decoupled DiLoCo (``units`` learners, a syncer)."""
    times, hit = _failures(model, failure_rng, duration_s, units)
    unit_chips = model.chips / units
    share = 1.0 / units
    state = [_Unit() for _ in range(units)]
    ledger = _Ledger(duration_s)
    heap: list[tuple[float, int, str, int]] = []
    order = 0

    def push(at: float, kind: str, who: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(heap, (at, order, kind, who))

    efficiency = model.sync_efficiency(units) if decoupled else 1.0
    latency = model.commit_latency_s(units) if decoupled else 0.0
    overlap = model.overlap_s
    syncer_up = True
    path_on = True
    epoch = 0
    if decoupled:
        syncer_rate = model.syncer_host_chips / model.chip_mtbf_s
        push(float(syncer_rng.exponential(1 / syncer_rate)), "syncer_fail", -1)
    for index in range(len(times)):
        push(float(times[index]), "fail", int(hit[index]))

    t = 0.0
    waiting_time = 0.0
    running_time = 0.0
    all_down_time = 0.0
    syncer_failures = 0
    weights: list[float] = []

    def useful_rate(now: float) -> float:
        rate = 0.0
        for unit in state:
            if unit.running(now):
                rate += share * max(0.0, 1.0 - unit.out_slices * model.slice_chips / unit_chips)
        return rate * efficiency

    def quorum_live(now: float) -> int:
        return sum(1 for unit in state if now >= unit.stalled_until)

    def update_path(now: float) -> None:
        nonlocal path_on, epoch
        if not decoupled:
            return
        on = syncer_up and quorum_live(now) >= model.quorum_size
        if on == path_on:
            return
        path_on = on
        epoch += 1
        if on:
            for who, unit in enumerate(state):
                if unit.waiting:
                    push(now + latency, "resume", who)
                    unit.wait_epoch = epoch
        else:
            for who, unit in enumerate(state):
                if now >= unit.stalled_until and not math.isinf(overlap):
                    push(now + overlap, "wait", who)
                    unit.wait_epoch = epoch

    while heap:
        at, _, kind, who = heapq.heappop(heap)
        at = min(at, duration_s)
        if at > t:
            rate = useful_rate(t)
            ledger.add(t, at, rate)
            live = [unit.running(t) for unit in state]
            if not any(live):
                all_down_time += at - t
            waiting_time += (at - t) * sum(share for unit in state if unit.waiting)
            running_time += (at - t) * share * sum(live)
            for unit, running in zip(state, live, strict=True):
                if running:
                    unit.steps += (at - t) / model.step_s
            t = at
        if t >= duration_s:
            break
        if kind == "fail":
            unit = state[who]
            unit.out_slices += 1
            push(t + model.slice_repair_s, "repair", who)
            if t < unit.stalled_until:
                continue  # joins the stall under way
            stall = model.stall_s
            if decoupled and model.restart_from_committed:
                lost = _lost_work_s(model, unit.steps)
                capacity = max(0.0, 1.0 - (unit.out_slices - 1) * model.slice_chips / unit_chips)
                ledger.remove(t, min(lost, t) * share * capacity * efficiency)
                stall += model.restart_reload_s()
                unit.steps = 0.0
                unit.stale = 1
            unit.waiting = False
            unit.stalled_until = t + stall
            push(unit.stalled_until, "back", who)
            update_path(t)
        elif kind == "repair":
            state[who].out_slices -= 1
        elif kind == "back":
            unit = state[who]
            if t < unit.stalled_until:
                continue
            if decoupled:
                weights.append(staleness_discount(unit.stale))
                unit.stale = 0
            update_path(t)
            if decoupled and not path_on and not math.isinf(overlap):
                push(t + overlap, "wait", who)
                unit.wait_epoch = epoch
        elif kind == "wait":
            unit = state[who]
            if unit.wait_epoch == epoch and not path_on and t >= unit.stalled_until:
                unit.waiting = True
        elif kind == "resume":
            unit = state[who]
            if unit.wait_epoch == epoch and path_on:
                unit.waiting = False
        elif kind == "syncer_fail":
            syncer_failures += 1
            syncer_up = False
            update_path(t)
            push(t + model.failover_s, "syncer_up", -1)
        elif kind == "syncer_up":
            syncer_up = True
            update_path(t)
            syncer_rate = model.syncer_host_chips / model.chip_mtbf_s
            push(t + float(syncer_rng.exponential(1 / syncer_rate)), "syncer_fail", -1)
    if t < duration_s:
        ledger.add(t, duration_s, useful_rate(t))
        if not any(unit.running(t) for unit in state):
            all_down_time += duration_s - t
    goodput = float(ledger.useful.sum() / duration_s)
    requests = None
    if decoupled:
        # rounds go on while some learner trains; each carries the learners training at the time
        training = running_time / duration_s
        active = 1.0 - all_down_time / duration_s
        contributions = min(float(units), max(1.0, units * training / max(active, 1e-9)))
        requests = request_rates(model, units, contributions, round_fraction=active)
    return Result(
        system="decoupled" if decoupled else "elastic_data_parallel",
        learners=units if decoupled else None,
        goodput=goodput,
        stderr=_batch_stderr(ledger.useful, ledger.span),
        duration_s=duration_s,
        failures=len(times),
        global_downtime=all_down_time / duration_s,
        waiting=(waiting_time + running_time * (1.0 - efficiency)) / duration_s,
        requests=requests,
        contribution_weight=float(np.mean(weights)) if weights else 1.0,
        extra={"syncer_failures": float(syncer_failures), "commit_latency_s": latency, "sync_efficiency": efficiency},
    )
