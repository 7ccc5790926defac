"""Algorithms: configuration, weights, merges, the outer step, fragment plan and schedule."""

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.algorithms.fragments import FragmentPlan, due_fragments, is_due, plan_fragments
from gradientmail.algorithms.merge import Rda, WeightedMean, merge_tensors, rda, weight, weighted_mean
from gradientmail.algorithms.outer import NesterovOuter, OuterState

__all__ = [
    "DiLoCo",
    "Rda",
    "WeightedMean",
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
]
