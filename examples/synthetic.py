"""Local SGD on synthetic learners: every commit equals the weighted average of their parameters.

Three learners fit one linear regression with different batch sizes and speeds. With
Local SGD settings (outer_lr=1, outer_momentum=0, weighted mean) the outer step lands
exactly on the learners' parameters averaged with weights samples²/steps, which this
script prints next to each commit. Run: python examples/synthetic.py
"""

from __future__ import annotations

import numpy as np

import gradientmail as gm
from gradientmail.algorithms.diloco import merge_tensors, weight
from gradientmail.algorithms.fragments import due_fragments, plan_fragments

# -- configuration -----------------------------------------------------------------
algorithm = gm.DiLoCo.local_sgd(sync_every=20, fragments=2)
learners = {"A": dict(batch=32, steps_per_tick=2), "B": dict(batch=32, steps_per_tick=1), "C": dict(batch=8, steps_per_tick=2)}
ticks, lr, features, seed = 60, 0.05, 8, 0

rng = np.random.default_rng(seed)
true_w = rng.standard_normal((features, 1)).astype(np.float32)
backend = gm.get_backend("numpy")
initial = {"linear.weight": np.zeros((features, 1), np.float32), "linear.bias": np.zeros(1, np.float32)}
plan = plan_fragments([(name, value.size) for name, value in initial.items()], algorithm.fragments)

committed = {name: value.copy() for name, value in initial.items()}  # the syncer's view
outer_state = [gm.OuterState.zeros(backend, {n: committed[n] for n in names}) for names in plan.fragments]
versions = [0] * len(plan)
models = {name: {k: v.copy() for k, v in initial.items()} for name in learners}
steps = {name: 0 for name in learners}
counters = {name: [[0, 0] for _ in plan.fragments] for name in learners}  # [steps, samples] per fragment


def sgd_step(model: dict[str, np.ndarray], batch: int) -> float:
    x = rng.standard_normal((batch, features)).astype(np.float32)
    y = x @ true_w + 0.5 + 0.01 * rng.standard_normal((batch, 1)).astype(np.float32)
    error = x @ model["linear.weight"] + model["linear.bias"] - y
    model["linear.weight"] -= lr * (x.T @ error) / batch
    model["linear.bias"] -= lr * error.mean(axis=0)
    return float((error**2).mean())


def close_round(fragment: int, contributions: dict[str, tuple[dict[str, np.ndarray], int, int]]) -> None:
    names = plan.fragments[fragment]
    anchor = {n: committed[n] for n in names}
    weights = [weight(k, s) for _, k, s in contributions.values()]
    deltas = [{n: backend.sub(anchor[n], params[n]) for n in names} for params, _, _ in contributions.values()]
    merged = merge_tensors(algorithm.merge, deltas, weights, backend)
    new, outer_state[fragment] = algorithm.outer.step(backend, anchor, outer_state[fragment], merged)
    committed.update(new)
    versions[fragment] += 1
    total = sum(weights)
    for n in names:
        expected = sum(w * params[n] for (params, _, _), w in zip(contributions.values(), weights)) / total
        who = ", ".join(f"{learner} w={w:,.0f}" for learner, w in zip(contributions, weights))
        print(
            f"fragment {fragment} v{versions[fragment]:<3} {n:<14} commit {np.round(new[n].ravel()[:3], 4)}"
            f"  expected {np.round(expected.ravel()[:3], 4)}  max|diff| {np.abs(new[n] - expected).max():.1e}  ({who})"
        )


for tick in range(ticks):
    due: dict[int, dict[str, tuple[dict[str, np.ndarray], int, int]]] = {}
    for name, spec in learners.items():
        for _ in range(spec["steps_per_tick"]):
            loss = sgd_step(models[name], spec["batch"])
            steps[name] += 1
            for counter in counters[name]:
                counter[0] += 1
                counter[1] += spec["batch"]
            for fragment in due_fragments(steps[name], algorithm.fragments, algorithm.sync_every):
                params = {n: models[name][n].copy() for n in plan.fragments[fragment]}
                due.setdefault(fragment, {})[name] = (params, *counters[name][fragment])
    for fragment, contributions in sorted(due.items()):
        close_round(fragment, contributions)
        for name in learners:  # every learner aligns with the commit and resets that fragment's counters
            for n in plan.fragments[fragment]:
                models[name][n][...] = committed[n]
            counters[name][fragment] = [0, 0]

error = float(np.abs(committed["linear.weight"] - true_w).max())
print(f"after {ticks} ticks: max |w - true_w| = {error:.3f}, bias = {committed['linear.bias'][0]:.3f} (true 0.5)")
