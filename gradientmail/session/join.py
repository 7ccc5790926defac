"""Joining a run: create it if we are first, else check we match it, then load its state.

The first learner creates the manifest (create-once) and version 0 of every fragment with
zero outer state. Any later learner compares its algorithm's run fields, its model's
parameter names, shapes and dtypes, and its run key with the manifest and refuses to join on
a difference (``RunConfigMismatch`` lists every one). The lease TTL and the retention policy
are the run's: a joiner with other settings uses the manifest's. A fragment still missing
version 0 (its creator died half-way) is initialised by whoever joins next; create-once
keeps that safe; a joiner other than the manifest's creator first waits up to the run's lease TTL
for the creator to write it (``INITIAL_POLL_S``), so that learners started together do not each
upload a whole model only to lose the create-once race (on a thin link, seconds each). A joiner
loads each fragment's newest version it can read (``newest_readable``): a deleted or damaged blob
of the newest (which the syncer restores by replay, INV-21) makes it start one version back, with
a warning, instead of refusing to start.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from gradientmail.algorithms.diloco import RUN_FIELDS, DiLoCo
from gradientmail.algorithms.fragments import plan_fragments
from gradientmail.algorithms.outer import OuterState
from gradientmail.backends import Backend
from gradientmail.digests import DEFAULT_BLOB_DIGEST, DigestName
from gradientmail.errors import (
    CorruptPayload,
    GradientMailError,
    IncompatiblePayload,
    InvalidRecord,
    KeyNotFound,
    RunConfigMismatch,
    Unauthenticated,
)
from gradientmail.records import Manifest, ParameterSpec, RoundRecord
from gradientmail.store import Arrays, Retention, RunSpec, RunStore, VersionDraft

__all__ = [
    "RunProposal",
    "checked_manifest",
    "differences",
    "join_run",
    "model_signature",
    "newest_readable",
    "parameter_differences",
    "proposed_manifest",
]

log = logging.getLogger(__name__)


def model_signature(backend: Backend, model: Any) -> tuple[ParameterSpec, ...]:
    """Names, shapes and dtypes of the model's parameters, in model order."""
    return tuple(
        ParameterSpec(name=name, shape=backend.shape(tensor), dtype=backend.dtype_name(tensor))
        for name, tensor in backend.named_parameters(model)
    )


class RunProposal:
    """What this node would create the run with: the settings that are the run's, not one node's."""

    def __init__(
        self,
        algorithm: DiLoCo,
        *,
        lease_ttl_s: float,
        retention: Retention | None = None,
        blob_digest: DigestName | None = DEFAULT_BLOB_DIGEST,
    ) -> None:
        self.algorithm = algorithm
        self.lease_ttl_s = lease_ttl_s
        self.retention = retention or Retention()
        self.blob_digest: DigestName | None = blob_digest
        """What a run this node creates pins its blobs by (None: its manifest names none, as runs
        from before ``blob_digest`` existed: sha256); a run that exists keeps its own."""


def proposed_manifest(backend: Backend, model: Any, proposal: RunProposal, learner_id: str, key_id: str | None) -> Manifest:
    signature = model_signature(backend, model)
    sizes = [(spec.name, spec.numel) for spec in signature]
    plan = plan_fragments(sizes, proposal.algorithm.fragments, proposal.algorithm.fragment_layout)
    return Manifest(
        run_id=uuid.uuid4().hex,
        algorithm=proposal.algorithm.to_manifest(),
        parameters=signature,
        plan=plan.fragments,
        created_by=learner_id,
        key_id=key_id,
        lease_ttl_s=proposal.lease_ttl_s,
        retention=proposal.retention.to_manifest(),
        blob_digest=proposal.blob_digest,
    )


def checked_manifest(store: RunStore) -> Manifest | None:
    """The manifest, verified under our key; a key mismatch becomes ``RunConfigMismatch``."""
    ours = store.key.key_id if store.key is not None else None
    try:
        manifest = store.read_manifest()
    except Unauthenticated:
        unverified = store.read_manifest(verify=False)
        theirs = unverified.key_id if unverified is not None else None
        raise RunConfigMismatch(
            [f"run key: the run is {'signed with key id ' + theirs if theirs else 'not signed'}, this node's key has id {ours}"]
        ) from None
    if manifest is not None and manifest.key_id != ours:
        if manifest.key_id is None:
            problem = (
                f"run key: the run at {store.url} is not signed; this node has a run key (id {ours}): drop it or start a new run"
            )
        elif ours is None:
            problem = f"run key: the run is signed (key id {manifest.key_id}); set GRADIENTMAIL_RUN_KEY (or run_key=) to its key"
        else:
            problem = f"run key: the run is signed with key id {manifest.key_id}, this node's key has id {ours}"
        raise RunConfigMismatch([problem])
    return manifest


def differences(manifest: Manifest, algorithm: DiLoCo, signature: tuple[ParameterSpec, ...]) -> list[str]:
    """Human-readable differences between the run and this node, empty if compatible."""
    found: list[str] = []
    run_algorithm = DiLoCo.from_manifest(manifest.algorithm).to_manifest()
    mine = algorithm.to_manifest()
    for field in RUN_FIELDS:
        if run_algorithm[field] != mine[field]:
            found.append(f"{field}: the run uses {run_algorithm[field]!r}, this node {mine[field]!r}")
    return found + parameter_differences(manifest, signature)


def parameter_differences(manifest: Manifest, signature: tuple[ParameterSpec, ...]) -> list[str]:
    """How a model's parameters (names, shapes, dtypes, order) differ from the run's, empty if
    they match: what joining checks, and what loading a run's parameters into a model checks."""
    found: list[str] = []
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


def join_run(store: RunStore, backend: Backend, model: Any, proposal: RunProposal, learner_id: str) -> tuple[RunSpec, bool]:
    """The run's view (its manifest created if absent) and whether this learner created it.

    Raises ``RunConfigMismatch`` when the run differs from this node (run key included).
    Initialises any fragment without version 0 from this model's parameters.
    """
    algorithm = proposal.algorithm
    proposed = proposed_manifest(backend, model, proposal, learner_id, store.key.key_id if store.key is not None else None)
    manifest = checked_manifest(store)
    created = False
    if manifest is None:
        created = store.create_manifest(proposed)
        manifest = proposed if created else checked_manifest(store)
        if manifest is None:  # create-once objects are never deleted
            raise GradientMailError(f"the manifest of {store.url} exists but cannot be read")
    problems = differences(manifest, algorithm, proposed.parameters)
    if problems:
        raise RunConfigMismatch(problems)
    spec = RunSpec.from_manifest(manifest)
    if not created and (spec.lease_ttl_s != proposal.lease_ttl_s or spec.retention != proposal.retention):
        log.info("using the run's lease TTL (%gs) and retention (%s)", spec.lease_ttl_s, spec.retention.to_manifest())
    # the creator writes version 0 itself (a creator restarted under its id too: it waits for nobody)
    waits = not created and manifest.created_by != learner_id
    deadline = time.monotonic() + (spec.lease_ttl_s if waits else 0.0)
    for fragment, names in enumerate(manifest.plan):
        if not _version_zero_written(store, fragment, deadline):
            params = backend.read_parameters(model, names)
            state = OuterState.zeros(backend, params).to_tensors()
            initial = VersionDraft.of(
                algorithm,
                fragment,
                0,
                {n: backend.to_numpy(t) for n, t in params.items()},
                {n: backend.to_numpy(t) for n, t in state.items()},
            )
            store.commit_version(initial, committed_by=learner_id, term=0, digest=spec.blob_digest)
    return spec, created


INITIAL_POLL_S = 0.25
"""How often a joiner looks for the version 0 the run's creator is writing."""


def _version_zero_written(store: RunStore, fragment: int, deadline: float) -> bool:
    """Whether ``fragment`` has a committed version, waiting for it until ``deadline`` (the
    creator writes version 0 right after the manifest; past the deadline it is presumed dead)."""
    while store.newest_version(fragment) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(INITIAL_POLL_S)
    return True


def _some(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def newest_readable(store: RunStore, spec: RunSpec, fragment: int) -> tuple[RoundRecord, Arrays]:
    """The newest committed version of ``fragment`` whose record and parameters read and
    verify, looking back at most ``keep_versions`` versions. Raises ``GradientMailError``
    listing what was wrong with each when none does."""
    newest = store.newest_version(fragment)
    if newest is None:
        raise GradientMailError(f"fragment {fragment} of {store.url} has no committed version")
    problems: list[str] = []
    for version in range(newest, max(-1, newest - spec.retention.keep_versions), -1):
        try:
            record = store.read_round(fragment, version)
            params = store.read_params(spec, record)
        except (KeyNotFound, CorruptPayload, IncompatiblePayload, InvalidRecord) as exc:
            problems.append(f"version {version}: {exc}")
            continue
        if problems:
            log.warning(
                "fragment %d: starting from version %d; newer ones cannot be read (%s)", fragment, version, "; ".join(problems)
            )
        return record, params
    raise GradientMailError(
        f"fragment {fragment} of {store.url}: no committed version can be read ({'; '.join(problems)}); "
        "run `gradientmail audit` on the mailbox"
    )
