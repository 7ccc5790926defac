"""Joining a run: create it if we are first, else check we match it, then load its state.

The first learner creates the manifest (create-once) and version 0 of every fragment with
zero outer state. Any later learner compares its algorithm's run fields and its model's
parameter names, shapes and dtypes with the manifest and refuses to join on a difference
(``RunConfigMismatch`` lists every one). A fragment still missing version 0 (its creator
died half-way) is initialised by whoever joins next; create-once keeps that safe.
"""

from __future__ import annotations

import uuid
from typing import Any

from gradientmail.algorithms.diloco import RUN_FIELDS, DiLoCo
from gradientmail.algorithms.fragments import plan_fragments
from gradientmail.algorithms.outer import OuterState
from gradientmail.backends import Backend
from gradientmail.errors import RunConfigMismatch
from gradientmail.records import Manifest, ParameterSpec
from gradientmail.store import RunSpec, RunStore

__all__ = ["differences", "join_run", "model_signature", "proposed_manifest"]


def model_signature(backend: Backend, model: Any) -> tuple[ParameterSpec, ...]:
    """Names, shapes and dtypes of the model's parameters, in model order."""
    return tuple(
        ParameterSpec(name=name, shape=backend.shape(tensor), dtype=backend.dtype_name(tensor))
        for name, tensor in backend.named_parameters(model)
    )


def proposed_manifest(backend: Backend, model: Any, algorithm: DiLoCo, learner_id: str) -> Manifest:
    signature = model_signature(backend, model)
    sizes = [(spec.name, spec.numel) for spec in signature]
    plan = plan_fragments(sizes, algorithm.fragments)
    return Manifest(
        run_id=uuid.uuid4().hex,
        algorithm=algorithm.to_manifest(),
        parameters=signature,
        plan=plan.fragments,
        created_by=learner_id,
    )


def differences(manifest: Manifest, algorithm: DiLoCo, signature: tuple[ParameterSpec, ...]) -> list[str]:
    """Human-readable differences between the run and this node, empty if compatible."""
    found: list[str] = []
    run_algorithm = DiLoCo.from_manifest(manifest.algorithm).to_manifest()
    mine = algorithm.to_manifest()
    for field in RUN_FIELDS:
        if run_algorithm[field] != mine[field]:
            found.append(f"{field}: the run uses {run_algorithm[field]!r}, this node {mine[field]!r}")
    theirs = {p.name: p for p in manifest.parameters}
    ours = {p.name: p for p in signature}
    missing = [n for n in theirs if n not in ours]
    extra = [n for n in ours if n not in theirs]
    if missing:
        found.append(f"parameters missing from this model: {_some(missing)}")
    if extra:
        found.append(f"parameters the run does not have: {_some(extra)}")
    for name in theirs.keys() & ours.keys():
        if tuple(theirs[name].shape) != tuple(ours[name].shape):
            found.append(f"{name}: the run has shape {tuple(theirs[name].shape)}, this model {tuple(ours[name].shape)}")
        if theirs[name].dtype != ours[name].dtype:
            found.append(f"{name}: the run has dtype {theirs[name].dtype}, this model {ours[name].dtype}")
    if not missing and not extra and [p.name for p in manifest.parameters] != [p.name for p in signature]:
        found.append("parameters are in a different order than the run's")
    return found


def join_run(store: RunStore, backend: Backend, model: Any, algorithm: DiLoCo, learner_id: str) -> tuple[RunSpec, bool]:
    """The run's view (its manifest created if absent) and whether this learner created it.

    Raises ``RunConfigMismatch`` when the run differs from this node. Initialises any
    fragment without version 0 from this model's parameters.
    """
    proposal = proposed_manifest(backend, model, algorithm, learner_id)
    manifest = store.read_manifest()
    created = False
    if manifest is None:
        manifest, created = store.create_manifest(proposal)
    problems = differences(manifest, algorithm, proposal.parameters)
    if problems:
        raise RunConfigMismatch(problems)
    for fragment, names in enumerate(manifest.plan):
        if store.newest_version(fragment) is None:
            params = backend.read_parameters(model, names)
            state = OuterState.zeros(backend, params).to_tensors()
            store.commit_version(
                fragment,
                0,
                {n: backend.to_numpy(t) for n, t in params.items()},
                {n: backend.to_numpy(t) for n, t in state.items()},
                algorithm=algorithm,
                committed_by=learner_id,
                term=0,
            )
    return RunSpec.from_manifest(manifest), created


def _some(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
