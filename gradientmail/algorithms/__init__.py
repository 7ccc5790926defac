"""Algorithms: configuration, weights, merges, the outer step, fragment plan and schedule."""

from gradientmail.algorithms.align import aligned_parameters, pseudo_gradient
from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.algorithms.fragments import FragmentPlan, due_fragments, is_due, plan_fragments
from gradientmail.algorithms.merge import IsoC, Rda, WeightedMean, merge_tensors, rda, weight, weighted_mean
from gradientmail.algorithms.outer import NesterovOuter, OuterState
from gradientmail.algorithms.schedule import (
    OnSchedule,
    first_due_step,
    half_period,
    must_wait_for_commit,
    next_due,
    on_schedule,
    overlap_bound,
    slot_free,
)

__all__ = [
    "DiLoCo",
    "Rda",
    "WeightedMean",
    "IsoC",
    "weight",
    "weighted_mean",
    "rda",
    "merge_tensors",
    "NesterovOuter",
    "OuterState",
    "FragmentPlan",
    "plan_fragments",
    "is_due",
    "due_fragments",
    "OnSchedule",
    "first_due_step",
    "next_due",
    "half_period",
    "on_schedule",
    "slot_free",
    "must_wait_for_commit",
    "overlap_bound",
    "pseudo_gradient",
    "aligned_parameters",
]
