"""Is a run in a regime that loses work? One line, from its round records, with the setting to change.

A run whose rounds close before the other learners' contributions arrive (steps short next to
the mailbox's round trip, a learner much slower than the rest) still commits, so nothing fails;
it only trains worse than it could, down to worse than one learner alone. ``gradientmail status``
and the main job print :func:`work_loss_hint` so that a user sees it, and what to set. A learner
whose link cannot carry a period's transfers (``session.transfer_meter``, in its lease) gets
:func:`link_hint` in ``gradientmail status``: the lighter form or the ``sync_every`` that fits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends.quantize import Codec
from gradientmail.backends.sparse import SparseCodec
from gradientmail.records import RoundRecord
from gradientmail.session.transfer_meter import LinkReading
from gradientmail.store import RunSpec

__all__ = [
    "CARRIED_SHARE",
    "LINK_BUSY",
    "LINK_FIT",
    "MERGED_SHARE_TARGET",
    "WIRE_FORMS",
    "WireForm",
    "WorkLoss",
    "carried_work_hint",
    "contribution_bytes",
    "link_hint",
    "measure_work_loss",
    "period_transfer_s",
    "smallest_sync_every",
    "work_loss_hint",
]

MERGED_SHARE_TARGET = 0.97
"""Share of learner steps that should reach a commit (docs/benchmarks.md's target)."""
RECENT_ROUNDS = 20
"""Newest round records (all fragments together) the check reads."""
SINGLE_ROUND_SHARE = 0.5
STALE_SHARE = 0.1
CARRIED_SHARE = 0.5
"""Share of merged steps trained before their learner had the round's base above which commits
reach learners about a round late (the torchft side-by-side: 70-100 %)."""
LINK_BUSY = 0.8
"""Share of a sync period a learner's transfers need (``session.transfer_meter``) above which the
link is the bottleneck: the next contribution waits behind the last one's upload."""
LINK_FIT = 0.5
"""Share a suggested setting should bring the transfers down to (room for a slower period)."""


@dataclass(frozen=True)
class WorkLoss:
    """What the newest rounds of a run say about lost work."""

    rounds: int
    single_learner_rounds: int
    """Rounds that merged one contribution while more learners took part in the run."""
    learners: int
    """Learners seen in those rounds (merged or rejected)."""
    stale: int
    merged: int
    carry_limit_steps: int
    """Steps learners dropped at ``max_carried_steps`` (reported in ``realigned``)."""
    merged_share: float | None = None
    merged_steps: int = 0
    carried_steps: int = 0
    """Of ``merged_steps``, those trained before their learner aligned with the round's base."""

    @property
    def carried_share(self) -> float:
        return self.carried_steps / self.merged_steps if self.merged_steps else 0.0

    @property
    def losing(self) -> bool:
        """Whether the run is in a regime that loses work."""
        lonely = self.learners >= 2 and self.rounds > 0 and self.single_learner_rounds / self.rounds >= SINGLE_ROUND_SHARE
        stale = self.merged + self.stale > 0 and self.stale / (self.merged + self.stale) >= STALE_SHARE
        short = self.merged_share is not None and self.merged_share < MERGED_SHARE_TARGET
        return lonely or stale or short or self.carry_limit_steps > 0


def measure_work_loss(records: Sequence[RoundRecord], merged_share: float | None = None) -> WorkLoss:
    """:class:`WorkLoss` of the newest ``RECENT_ROUNDS`` of ``records`` (version 0 is skipped)."""
    recent = sorted((r for r in records if r.version > 0), key=lambda r: r.version)[-RECENT_ROUNDS:]
    learners = {p.learner for r in recent for p in r.participants} | {x.learner for r in recent for x in r.rejected}
    return WorkLoss(
        rounds=len(recent),
        single_learner_rounds=sum(1 for r in recent if len(r.participants) == 1),
        learners=len(learners),
        stale=sum(1 for r in recent for x in r.rejected if x.reason == "stale"),
        merged=sum(len(r.participants) for r in recent),
        carry_limit_steps=sum(d.steps for r in recent for p in r.participants for d in p.realigned if d.reason == "carry_limit"),
        merged_share=merged_share,
        merged_steps=sum(p.steps for r in recent for p in r.participants),
        carried_steps=sum(min(p.carried_steps, p.steps) for r in recent for p in r.participants),
    )


def work_loss_hint(loss: WorkLoss, algorithm: DiLoCo) -> str | None:
    """One line saying the run loses work and the setting to change, or None when it does not."""
    if not loss.losing:
        return None
    seen = [f"{loss.single_learner_rounds} of {loss.rounds} recent rounds merged one of {loss.learners} learners"]
    if loss.stale:
        seen.append(f"{loss.stale} contribution{'s' if loss.stale != 1 else ''} came stale")
    if loss.carry_limit_steps:
        seen.append(f"{loss.carry_limit_steps} steps dropped at the carry limit")
    if loss.merged_share is not None:
        seen.append(f"{100 * loss.merged_share:.1f} % of learner steps merged")
    if algorithm.grace_rule == "slack":
        change = 'set gm.DiLoCo(grace_rule="live") (GRADIENTMAIL_GRACE_RULE=live): rounds then wait for the live learners'
    else:
        change = (
            f"raise grace_periods (now {algorithm.grace_periods:g}; GRADIENTMAIL_GRACE_PERIODS) so rounds wait longer, "
            "or quorum_size to the number of learners"
        )
    return f"work lost: rounds close before the other learners' contributions arrive ({'; '.join(seen)}); {change}"


def carried_work_hint(loss: WorkLoss, algorithm: DiLoCo) -> str | None:
    """One line when most merged work was trained before its learner had the round's base
    (commits arrive about a round late: short steps next to the round trip), with what to set;
    None otherwise."""
    if loss.carried_share < CARRIED_SHARE:
        return None
    seen = f"{100 * loss.carried_share:.0f} % of the merged steps were trained before their learner had the round's base"
    if algorithm.momentum_rule == "fixed":
        change = 'set gm.DiLoCo(momentum_rule="damped") (GRADIENTMAIL_MOMENTUM_RULE=damped): momentum overshoots on such work'
    else:
        change = (
            f"a larger sync_every (now {algorithm.sync_every}) or overlap_steps=0 (wait for each commit) "
            "trains closer to lock-step"
        )
    return f"commits arrive about a round late ({seen}); {change}"


def contribution_bytes(spec: RunSpec, codec: Codec | SparseCodec | None) -> int:
    """Payload bytes of one contribution of every fragment in the form ``codec`` (None: the
    run's ``delta_dtype``), headers left out (``RunSpec.contribution_bytes``)."""
    return sum(spec.contribution_bytes(fragment, codec) for fragment in range(len(spec.fragments)))


def _lighter_deltas(spec: RunSpec) -> list[tuple[str, Codec | SparseCodec]]:
    """The contribution forms lighter than the run's, lightest last, as the setting that picks each."""
    algorithm = spec.algorithm
    ladder: list[tuple[str, Codec | SparseCodec]] = [
        (f'delta_quantization="{form}" (GRADIENTMAIL_DELTA_QUANTIZATION={form})', Codec(form, algorithm.quantization_block))
        for form in ("int8", "int4", "int2")
    ]
    k = algorithm.sparsity_chunk // 64
    if k >= 8:  # SparseLoCo's 1/64, values int2
        setting = "delta_sparsity=0.015625 (GRADIENTMAIL_DELTA_SPARSITY=0.015625)"
        ladder.append((setting, SparseCodec(k, algorithm.sparsity_chunk)))
    now = contribution_bytes(spec, algorithm.delta_codec)
    return [(setting, codec) for setting, codec in ladder if contribution_bytes(spec, codec) < now]


def link_hint(holder: str, reading: LinkReading, spec: RunSpec) -> str | None:
    """One line when ``holder``'s transfers need at least ``LINK_BUSY`` of a sync period
    (``session.transfer_meter``): the link is the bottleneck, with the lightest change
    that would bring them to ``LINK_FIT``: a lighter contribution form when uploads dominate, a
    compact commit form when fetches do, and the ``sync_every`` that spreads the same bytes
    thin enough. None below ``LINK_BUSY``."""
    if reading.busy_share < LINK_BUSY:
        return None
    algorithm = spec.algorithm
    seen = (
        f"{holder}: the link is the bottleneck: a sync period's transfers need {100 * reading.busy_share:.0f} % of its "
        f"{reading.period_s:.3g} s ({100 * reading.up_share:.0f} % uploading contributions, "
        f"{100 * reading.down_share:.0f} % fetching commits), so contributions wait behind each other"
    )
    changes = []
    if reading.up_share >= reading.down_share:
        now = contribution_bytes(spec, algorithm.delta_codec)
        lighter = [(setting, contribution_bytes(spec, codec) / now) for setting, codec in _lighter_deltas(spec)]
        fitting = [(setting, ratio) for setting, ratio in lighter if reading.up_share * ratio + reading.down_share <= LINK_FIT]
        if lighter:  # the lightest that fits, else the lightest there is
            setting, ratio = (fitting or lighter[-1:])[0]
            changes.append(f"{setting}: {ratio:.2f}× the bytes per contribution")
    elif algorithm.update_codec is None:
        changes.append(
            'update_quantization="int4" (GRADIENTMAIL_UPDATE_QUANTIZATION=int4): a learner one version behind '
            "fetches each commit as its int4 change"
        )
    every = math.ceil(algorithm.sync_every * reading.busy_share / LINK_FIT)
    changes.append(f"sync_every={every} (GRADIENTMAIL_SYNC_EVERY={every}): the same transfers over more steps")
    return f'{seen}; set {", or ".join(changes)} (docs/operations.md, "A thin link")'


# -- the regime map (docs/operations.md, "A thin link") -------------------------------------


@dataclass(frozen=True)
class WireForm:
    """How a run's bytes travel: its contributions (None: fp32 floats) and the compact change of
    each commit learners one version behind fetch (None: they fetch the full fp32 parameters)."""

    name: str
    contribution: Codec | SparseCodec | None
    commit: Codec | SparseCodec | None

    def contribution_bytes(self, parameters: int) -> int:
        return 4 * parameters if self.contribution is None else self.contribution.nbytes(parameters)

    def commit_bytes(self, parameters: int) -> int:
        return 4 * parameters if self.commit is None else self.commit.nbytes(parameters)


WIRE_FORMS = (
    WireForm("defaults (fp32)", None, None),
    WireForm("int4 both ways", Codec("int4"), Codec("int4")),
    WireForm("sparse 1/64 (4 learners)", SparseCodec(64, 4096, "int2"), SparseCodec(256, 4096, "int4")),
)
"""The forms the regime map compares (``benchmarks.link``'s settings)."""
OUTER_STATE_COPIES = 1
"""fp32 copies of the model a commit writes beside its parameters: Nesterov's momentum."""


def period_transfer_s(form: WireForm, parameters: int, link_bytes_per_s: float, learners: int, *, syncer: bool) -> float:
    """Seconds a node's link needs per sync period: as a learner, one contribution up and one
    commit down per parameter; the node that runs the syncer also reads every learner's
    contribution and writes each commit whole (fp32 parameters and outer state, the compact
    change beside them): what a takeover and a learner far behind read."""
    moved = form.contribution_bytes(parameters) + form.commit_bytes(parameters)
    if syncer:
        moved += learners * form.contribution_bytes(parameters)
        moved += 4 * parameters * (1 + OUTER_STATE_COPIES) + (form.commit_bytes(parameters) if form.commit else 0)
    return moved / link_bytes_per_s


def smallest_sync_every(transfer_s: float, step_s: float, fit: float = LINK_FIT) -> int:
    """The smallest ``sync_every`` whose period holds ``transfer_s`` within ``fit`` of it."""
    return max(1, math.ceil(transfer_s / (step_s * fit)))
