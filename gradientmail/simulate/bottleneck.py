"""The bottlenecks a real round meets, in closed form (issue 26, part 3).

Per sync period (H steps, in which every fragment is exchanged once): the bytes each node moves
for each syncer layout, the store's egress cost when nodes read it from another region, how many
learners a round carries when steps are short next to the round's own time, and the largest run
a layout sustains on a given NIC and store. :class:`~gradientmail.simulate.model.Model` holds the
parameters; ``benchmarks/sim_calibration.py`` fits the round's rates on a real store and checks
these forms against real rounds. docs/simulator.md has the reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradientmail.simulate.model import Model

__all__ = [
    "NodeTraffic",
    "busiest_node",
    "busiest_share",
    "carried_per_round",
    "contributions_per_round",
    "egress_bytes_per_period",
    "egress_usd_per_day",
    "largest_learners",
    "mean_node",
    "round_window_s",
    "sustains",
]

DAY_S = 86400.0


@dataclass(frozen=True)
class NodeTraffic:
    """What one node moves to and from the store per sync period, and the seconds it spends closing rounds."""

    ingress_bytes: float
    egress_bytes: float
    closing_s: float

    def __add__(self, other: NodeTraffic) -> NodeTraffic:
        return NodeTraffic(
            self.ingress_bytes + other.ingress_bytes, self.egress_bytes + other.egress_bytes, self.closing_s + other.closing_s
        )

    def scaled(self, factor: float) -> NodeTraffic:
        return NodeTraffic(self.ingress_bytes * factor, self.egress_bytes * factor, self.closing_s * factor)


def _rounds(learners: int, contributions: float | None) -> float:
    """Rounds each fragment closes per period: one when every round carries all M learners."""
    return learners / (learners if contributions is None else max(1.0, min(contributions, learners)))


def _learner(model: Model, learners: int, contributions: float | None) -> NodeTraffic:
    """A node's learner: it publishes every fragment once and reads every commit of each."""
    return NodeTraffic(model.model_bytes * _rounds(learners, contributions), model.model_bytes, 0.0)


def _closer(model: Model, learners: int, contributions: float | None, fragments: float) -> NodeTraffic:
    """A node closing ``fragments`` fragments: it reads every learner's contribution of each and
    writes each round's parameters and outer state."""
    rounds = _rounds(learners, contributions)
    carried = learners / rounds
    size = model.fragment_bytes
    return NodeTraffic(
        ingress_bytes=fragments * learners * size,
        egress_bytes=fragments * rounds * size * (1.0 + model.syncer_state_copies),
        closing_s=fragments * rounds * model.sync_s(carried),
    )


def busiest_node(model: Model, learners: int, contributions: float | None = None) -> NodeTraffic:
    """The node with the most to do: its learner plus the fragments it closes (all P with one
    syncer; ⌈P / min(M, P)⌉ under ``spread``)."""
    return _learner(model, learners, contributions) + _closer(
        model, learners, contributions, model.fragments_on_busiest(learners)
    )


def mean_node(model: Model, learners: int, contributions: float | None = None) -> NodeTraffic:
    """The mean over the M nodes: every closing byte of the run divided by M."""
    closing = _closer(model, learners, contributions, model.fragments).scaled(1.0 / learners)
    return _learner(model, learners, contributions) + closing


def busiest_share(model: Model, learners: int) -> float:
    """The busiest node's syncer bytes over the mean node's (what ``benchmarks/spread.py`` measures):
    M with one syncer, ⌈P / min(M, P)⌉ · M / P under ``spread`` (1 when P is a multiple of M)."""
    return model.fragments_on_busiest(learners) * learners / model.fragments


def egress_bytes_per_period(model: Model, learners: int, contributions: float | None = None) -> float:
    """Bytes read out of the store per period: the closing nodes read every contribution, every
    learner reads every commit."""
    closing = _closer(model, learners, contributions, model.fragments)
    return closing.ingress_bytes + learners * _learner(model, learners, contributions).ingress_bytes


def egress_usd_per_day(model: Model, learners: int, contributions: float | None = None) -> float:
    """A day of those reads at ``egress_usd_per_gb`` (0 when every node is in the store's region)."""
    periods = DAY_S / (model.sync_every * model.step_s)
    return periods * egress_bytes_per_period(model, learners, contributions) / 1e9 * model.egress_usd_per_gb


def round_window_s(model: Model, contributions: float) -> float:
    """Seconds a round takes publishes after its first: the grace window (the library's slack rule)
    plus one poll (the closing node notices the quorum, then the window's end, each on its next
    pass: half a poll late on average)."""
    return model.grace_s(max(1, round(contributions))) + model.poll_s


def contributions_per_round(model: Model, learners: int, arrival_spread_s: float | None = None) -> float:
    """Learners a round carries when their publishes of a fragment spread over ``arrival_spread_s``
    seconds per period; None: phases spread evenly round the period (gap T/M between neighbours,
    learners of equal speed that started apart: the short-step worst case). Lock-step (S = 0)
    carries all M; a window short next to the gap carries one. Evaluated at its own answer (a fixed
    point: a round of fewer contributions closes faster)."""
    period = model.sync_every * model.step_s  # a fragment is published once every H steps
    spread = period * (learners - 1) / learners if arrival_spread_s is None else arrival_spread_s
    carried = float(learners)
    for _ in range(50):
        updated = carried_per_round(learners, spread, round_window_s(model, carried), model.sync_s(carried))
        if abs(updated - carried) < 1e-9:
            break
        carried = updated
    return carried


def carried_per_round(learners: int, arrival_spread_s: float, window_s: float, sync_s: float) -> float:
    """The form itself: M publishes evenly spaced over S (gap g = S / (M − 1)). A round takes its
    opener and the publishes within its window W; those that come while it closes (ξ_sync) wait and
    open the next. Sparse publishes: 1 + W / g a round; dense ones: one round per W + ξ_sync, so
    (W + ξ_sync) / g a round. The larger of the two, at most M."""
    if learners <= 1 or arrival_spread_s <= 0:
        return float(learners)
    gap = arrival_spread_s / (learners - 1)
    return min(float(learners), max(1.0 + window_s / gap, (window_s + sync_s) / gap))


def sustains(model: Model, learners: int) -> bool:
    """The busiest node keeps up within one period: its closing seconds plus its own learner's
    transfers at its NIC rate fit in H steps' time. (Learners may still wait for a commit when
    the overlap is shorter than its latency: ``Model.sync_efficiency`` counts that.)"""
    node = busiest_node(model, learners)
    own = _learner(model, learners, None)
    transfer_s = (own.ingress_bytes + own.egress_bytes) / model.closing_bandwidth_bps
    return node.closing_s + transfer_s <= model.sync_every * model.step_s


def largest_learners(model: Model, limit: int = 1 << 16) -> int:
    """The largest M the layout sustains (:func:`sustains`), 0 when not even one learner; ``limit``
    when it sustains that many (the busiest node's work grows with M in both layouts)."""
    if not sustains(model, 1):
        return 0
    lo, hi = 1, 2
    while hi < limit and sustains(model, hi):
        lo, hi = hi, min(limit, hi * 2)
    if sustains(model, hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if sustains(model, mid) else (lo, mid)
    return lo
