"""``gradientmail audit``: check a run from its mailbox alone, trusting nothing in it.

What it checks (docs/protocol.md, "Audit"), per fragment:

* every round record still kept parses, verifies under the run key (when the run is signed)
  and names the version and fragment of its key;
* the newest ``keep_versions`` versions are all there (no gap), each record names the digest of
  the record before it (the hash chain: a rollback or a rewritten record breaks it), and the
  head pointer names the newest record's digest;
* every blob a kept record references is there, with its size and sha256, and decodes to the
  manifest's tensors;
* every round inside the audit window replays to the committed bytes, and no contribution is
  merged twice.

Beside the fragments: every work queue's claims and done markers (INV-24) and every barrier
arrival are valid records, and every object under the layout's folders is a key of the layout
(listed by the audit itself).

Failures are listed and counted; warnings (a lease that does not verify, versions retention
has yet to collect) are listed but do not fail the audit.

With a digest log (``gradientmail audit URL --digest-log FILE``, a file on the auditor's
machine, outside the bucket and its retention) the audit also remembers the digest of every
record it has checked, and fails when a remembered version now has another digest (rewritten
history: a fork, a forged rollback) or when the mailbox's newest version is older than one it
remembers (newer records deleted) — even after retention has collected the evidence.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gradientmail.backends import Backend, get_backend, payload
from gradientmail.errors import BackendUnavailable, GradientMailError, KeyNotFound
from gradientmail.records import keys
from gradientmail.store import RunSpec, RunStore, StoredRound
from gradientmail.syncer.rounds import replay_round

__all__ = ["AuditReport", "DigestLog", "audit_run"]

REPLAY_TOLERANCE = 1e-5
"""Relative agreement accepted when a round is replayed on another backend than the one that
merged it (the backends agree within 1e-6; bytes are compared whenever the backend is here)."""


@dataclass
class AuditReport:
    """What the audit checked, what failed and what it merely noticed."""

    checked: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.failures

    def ok(self, what: str) -> None:
        self.checked.append(what)

    def fail(self, what: str) -> None:
        self.failures.append(what)

    def warn(self, what: str) -> None:
        self.warnings.append(what)


class DigestLog:
    """The record digests earlier audits saw, one JSON line per (run, fragment, version), kept
    by the auditor outside the mailbox so that retention cannot collect them."""

    def __init__(self, path: Path, run_id: str) -> None:
        self.path = path
        self.run_id = run_id
        self.seen: dict[tuple[int, int], str] = {}
        self._new: list[dict[str, object]] = []
        if path.exists():
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    entry = json.loads(line)
                    if entry["run_id"] == run_id:
                        self.seen[(int(entry["fragment"]), int(entry["version"]))] = str(entry["sha256"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise GradientMailError(f"digest log {path} line {number} is not an audit entry: {exc}") from None

    def check(self, fragment: int, stored: dict[int, StoredRound], report: AuditReport) -> None:
        """Compare what the mailbox holds now with what earlier audits saw; remember the new."""
        where = f"fragment {fragment}"
        remembered = {v: digest for (f, v), digest in self.seen.items() if f == fragment}
        newest = max(stored, default=-1)
        changed = [v for v, digest in sorted(remembered.items()) if v in stored and stored[v].sha256 != digest]
        # a kept record whose predecessor is remembered must name that digest: catches a rewrite
        # whose own records retention has collected since
        changed += [
            v - 1
            for v, current in sorted(stored.items())
            if v - 1 in remembered and v - 1 not in stored and current.record.previous != remembered[v - 1]
        ]
        if remembered and stored and not any(v in remembered or v - 1 in remembered for v in stored):
            report.warn(f"{where}: no kept record overlaps the digest log (audit at least every keep_versions commits)")
        if changed:
            report.fail(
                f"{where}: versions {changed} differ from the records an earlier audit saw (rewritten: a fork or a rollback)"
            )
        if remembered and max(remembered) > newest:
            report.fail(
                f"{where}: the newest record is version {newest}, but an earlier audit saw version {max(remembered)} "
                "(newer records were deleted or rolled back)"
            )
        if not changed and not (remembered and max(remembered) > newest):
            report.ok(f"{where}: consistent with the {len(remembered)} digests earlier audits logged")
        for version, current in sorted(stored.items()):
            if version not in remembered:
                self.seen[(fragment, version)] = current.sha256
                self._new.append({"run_id": self.run_id, "fragment": fragment, "version": version, "sha256": current.sha256})

    def save(self) -> None:
        """Append what this audit saw for the first time (flushed to disk)."""
        if not self._new:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.writelines(json.dumps(entry, sort_keys=True) + "\n" for entry in self._new)
            out.flush()
            os.fsync(out.fileno())
        self._new = []


def audit_run(
    store: RunStore, spec: RunSpec, say: Callable[[str], None] = lambda _: None, digest_log: DigestLog | None = None
) -> AuditReport:
    """Audit every fragment of the run in ``store``; ``say`` gets one line per finding. With
    ``digest_log``, also check against (and extend) what earlier audits saw; it is saved only
    when nothing failed, so a log never learns tampered history."""
    report = AuditReport()
    if spec.manifest.key_id is not None and store.key is None:
        report.fail("the run is signed but no run key was given: signatures cannot be checked")
    else:
        report.ok("manifest" + (" signature" if store.key is not None else " (unsigned run)"))
    for fragment in range(len(spec.fragments)):
        stored = _audit_fragment(store, spec, fragment, report)
        if digest_log is not None:
            digest_log.check(fragment, stored, report)
    _audit_leases(store, report)
    _audit_queues(store, report)
    _audit_barriers(store, report)
    _audit_names(store, report)
    if digest_log is not None and report.clean:
        digest_log.save()
    for line in report.checked:
        say(f"ok    {line}")
    for line in report.warnings:
        say(f"warn  {line}")
    for line in report.failures:
        say(f"FAIL  {line}")
    return report


def _audit_fragment(store: RunStore, spec: RunSpec, fragment: int, report: AuditReport) -> dict[int, StoredRound]:
    """Audit one fragment; the round records that read, by version."""
    retention = spec.retention
    where = f"fragment {fragment}"
    versions = store.committed_versions(fragment)
    if not versions:
        report.fail(f"{where}: no committed version")
        return {}
    newest = versions[-1]
    window = range(max(0, newest - retention.keep_versions + 1), newest + 1)
    missing = [v for v in window if v not in versions]
    if missing:
        report.fail(f"{where}: versions {missing} missing from the kept window {window.start}..{newest}")
    else:
        report.ok(f"{where}: versions {window.start}..{newest} all present")
    extra = sorted(set(versions) - retention.kept_versions(set(versions), newest))
    if extra:
        report.warn(f"{where}: {len(extra)} versions retention has not collected yet (oldest {extra[0]})")
    stored: dict[int, StoredRound] = {}
    for version in versions:
        try:
            stored[version] = store.read_stored_round(fragment, version)
        except GradientMailError as exc:
            report.fail(f"{where} version {version}: record refused: {exc}")
    _check_chain(stored, where, report)
    _check_head(store, fragment, newest, stored.get(newest), report)
    _check_blobs(store, spec, stored, where, report)
    _check_merged_once(stored, where, report)
    first_audited = max(1, newest - retention.audit_rounds + 1)
    replayed = 0
    for version in range(first_audited, newest + 1):
        if version in stored and version - 1 in stored:
            replayed += _check_replay(store, spec, fragment, stored[version], report)
    report.ok(f"{where}: {replayed} of {newest - first_audited + 1} rounds in the audit window replayed")
    return stored


def _check_chain(stored: dict[int, StoredRound], where: str, report: AuditReport) -> None:
    links = 0
    for version, current in sorted(stored.items()):
        record = current.record
        if version == 0:
            if record.previous is not None or record.base_version is not None:
                report.fail(f"{where} version 0: names a previous record or base version")
            continue
        if record.base_version != version - 1:
            report.fail(f"{where} version {version}: built on version {record.base_version}, not {version - 1}")
        before = stored.get(version - 1)
        if before is None:
            continue  # retired by retention: the chain restarts at the oldest kept record
        if record.previous != before.sha256:
            report.fail(f"{where} version {version}: does not name version {version - 1}'s digest (rewritten or forged history)")
        else:
            links += 1
    report.ok(f"{where}: hash chain checked over {links} links")


def _check_head(store: RunStore, fragment: int, newest: int, top: StoredRound | None, report: AuditReport) -> None:
    head = store.read_head(fragment)
    if head is None or top is None:
        report.warn(f"fragment {fragment}: no valid head pointer")
    elif head.version == newest and head.record_sha256 != top.sha256:
        report.fail(f"fragment {fragment} version {newest}: the record differs from the one the head pointer names (rewritten)")
    elif head.version > newest:
        report.fail(
            f"fragment {fragment}: the head pointer names version {head.version}, but the newest record is version {newest} "
            "(newer records were deleted)"
        )
    elif head.version < newest - 1:
        report.fail(
            f"fragment {fragment}: the head pointer names version {head.version}, {newest - head.version} behind the newest "
            f"record {newest} (a replayed or rolled-back head)"
        )
    elif head.version != newest:  # a commit in progress, or its head write failed: the next one fixes it
        report.warn(f"fragment {fragment}: head pointer at version {head.version}, newest is {newest}")
    else:
        report.ok(f"fragment {fragment}: head pointer names version {newest} and its digest")


def _check_blobs(store: RunStore, spec: RunSpec, stored: dict[int, StoredRound], where: str, report: AuditReport) -> None:
    checked = 0
    params_of: dict[int, dict[str, np.ndarray]] = {}
    for version, current in sorted(stored.items()):
        record = current.record
        try:
            params_of[version] = store.read_params(spec, record)
            store.blobs.read_tensors(record.outer_state)
            checked += 2
            if record.update is not None:  # INV-16: the compact update rebuilds the committed bytes
                base = params_of.get(record.base_version) if record.base_version is not None else None
                if base is not None:
                    store.rebuild_params(spec, record, base)
                else:
                    store.blobs.read(record.update)
                checked += 1
        except GradientMailError as exc:
            report.fail(f"{where} version {version}: referenced blob bad: {exc}")
        params_of.pop(version - 2, None)
    report.ok(f"{where}: {checked} referenced blobs present with matching size and sha256")


def _check_merged_once(stored: dict[int, StoredRound], where: str, report: AuditReport) -> None:
    merged_in: dict[str, int] = {}
    for version, current in sorted(stored.items()):
        for participant in current.record.participants:
            if participant.contribution in merged_in:
                report.fail(
                    f"{where}: {participant.contribution} merged by versions {merged_in[participant.contribution]} and {version}"
                )
            merged_in[participant.contribution] = version
    report.ok(f"{where}: {len(merged_in)} contributions each merged once")


def _check_replay(store: RunStore, spec: RunSpec, fragment: int, current: StoredRound, report: AuditReport) -> int:
    record = current.record
    where = f"fragment {fragment} version {record.version}"
    backend, exact = _replay_backend(record.backend)
    try:
        replayed = replay_round(store, backend, spec, fragment, record.version)
        committed = store.read_params(spec, record)
    except KeyNotFound as exc:
        report.fail(f"{where}: cannot replay, an input is gone: {exc}")
        return 0
    except GradientMailError as exc:
        report.fail(f"{where}: replay failed: {exc}")
        return 0
    ours = {name: backend.to_numpy(tensor) for name, tensor in replayed.items()}
    if exact:
        if payload.encode(ours) != store.blobs.read(record.params):
            report.fail(f"{where}: replay differs from the committed bytes")
            return 0
    elif not all(_close(ours[name], committed[name]) for name in committed):
        report.fail(f"{where}: replay on {backend.name} differs from the committed parameters beyond {REPLAY_TOLERANCE}")
        return 0
    return 1


def _replay_backend(name: str | None) -> tuple[Backend, bool]:
    """The backend that merged the round if it is installed (bytes must match), else NumPy
    (values must agree within ``REPLAY_TOLERANCE``)."""
    try:
        return get_backend(name or "numpy"), True
    except (BackendUnavailable, GradientMailError):
        return get_backend("numpy"), False


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale = max(float(np.max(np.abs(b64))) if b64.size else 0.0, 1e-30)
    return bool(np.all(np.abs(a64 - b64) <= REPLAY_TOLERANCE * scale))


def _audit_names(store: RunStore, report: AuditReport) -> None:
    """Every object under the layout's folders is a key of the layout: anything else was written
    outside the protocol (nodes skip it, INV-7; the audit names it). The audit lists the names
    itself, so a name a node's store skipped before is still found. Objects outside the folders
    (beside the run, in a shared bucket) are no node's business and not listed."""
    listed, strays = 0, list[str]()
    for folder in keys.FOLDERS:
        count, found = store.stray_names(folder)
        listed, strays = listed + count, strays + found
    if strays:
        shown = ", ".join(repr(name[:80]) for name in strays[:5])
        report.fail(f"{len(strays)} objects in the mailbox are no key of the run's layout (not written by the protocol): {shown}")
    else:
        report.ok(f"all {listed} objects under {', '.join(keys.FOLDERS)} are keys of the layout")


def _audit_queues(store: RunStore, report: AuditReport) -> None:
    """Every claim and done marker of every work queue is a valid record (INV-24): one that is
    not was written outside the protocol (its unit is taken over, or trained again)."""
    for queue in store.queues.queue_names():
        claimed, _ = store.queues.units(queue)
        invalid = store.queues.invalid_done(queue)
        bad_claims = [unit for unit in sorted(claimed) if (found := store.queues.read_claim(queue, unit)) and found[0] is None]
        if invalid:
            shown = "; ".join(f"unit {unit}: {problem[:120]}" for unit, problem in sorted(invalid.items())[:5])
            report.fail(f"queue {queue}: {len(invalid)} done markers are not valid records (the units stay open): {shown}")
        if bad_claims:
            report.fail(f"queue {queue}: {len(bad_claims)} claims are not valid records (taken over): units {bad_claims[:10]}")
        if not invalid and not bad_claims:
            report.ok(f"queue {queue}: every claim and done marker is a valid record")


def _audit_barriers(store: RunStore, report: AuditReport) -> None:
    """Every barrier arrival is its node's signed arrival at its barrier (nodes count no other)."""
    for barrier in store.barriers.barrier_names():
        nodes = store.barriers.nodes(barrier)
        bad = sorted(node for node in nodes if store.barriers.read_arrival(barrier, node) is None)
        if bad:
            report.fail(f"barrier {barrier}: {len(bad)} arrivals are not valid records (counted as no party): {bad[:10]}")
        else:
            report.ok(f"barrier {barrier}: all {len(nodes)} arrivals are valid records")


def _audit_leases(store: RunStore, report: AuditReport) -> None:
    for key in [keys.SYNCER_LEASE, *store.leases.learner_keys()]:
        found = store.leases.read(key)
        if found is not None and found.lease is None:
            report.warn(f"{key}: unusable lease, nodes treat it as expired ({found.problem})")
