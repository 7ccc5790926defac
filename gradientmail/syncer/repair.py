"""Putting back a committed version's blobs that someone deleted or damaged, by replay.

A version's parameters and outer state are a pure function of the version before and the
contributions its record lists (INV-4), and retention keeps both for the newest
``audit_rounds`` rounds. So a syncer that loads a version whose blob is gone recomputes it,
checks it against the digest and size the record pins, and writes the same bytes back at the
same key (INV-21): nothing committed is lost, and nothing but the committed bytes can be
written there (they are checked before the write). The compact update blob is not restored:
learners without it read the full parameters.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gradientmail.backends import Backend, payload
from gradientmail.errors import CorruptPayload, GradientMailError, InvalidRecord, KeyNotFound
from gradientmail.store import CommittedVersion, RunSpec, RunStore
from gradientmail.syncer.rounds import replayed_draft

__all__ = ["Repaired", "load_or_repair", "restore_version"]

log = logging.getLogger(__name__)


def restore_version(store: RunStore, backend: Backend, spec: RunSpec, fragment: int, version: int) -> list[str]:
    """Rewrite the missing or damaged parameter and outer-state blobs of ``version`` from a
    replay of its round; the keys written. Raises ``GradientMailError`` naming the version
    when it cannot (version 0, its inputs collected by retention, a replay on another backend
    that does not reproduce the committed bytes)."""
    record = store.read_round(fragment, version)
    damaged = [ref for ref in (record.params, record.outer_state) if not store.blobs.intact(ref)]
    if not damaged:
        return []
    try:
        draft = replayed_draft(store, backend, spec, fragment, version)
    except (KeyNotFound, CorruptPayload, GradientMailError) as exc:
        raise GradientMailError(
            f"fragment {fragment} version {version}: {', '.join(ref.key for ref in damaged)} missing or damaged, "
            f"and its round cannot be replayed to restore it: {exc}"
        ) from exc
    recomputed = {record.params.key: draft.params, record.outer_state.key: draft.state.to_tensors()}
    for ref in damaged:
        data = payload.encode({name: backend.to_numpy(tensor) for name, tensor in recomputed[ref.key].items()})
        store.blobs.restore(ref, data)
    return [ref.key for ref in damaged]


@dataclass(frozen=True)
class Repaired:
    """What ``load_or_repair`` did instead of loading: a forged round record deleted, or blobs
    restored by replay (the next pass loads what is there now)."""

    removed_round: bool = False
    restored: tuple[str, ...] = ()


def load_or_repair(store: RunStore, backend: Backend, spec: RunSpec, fragment: int, version: int) -> CommittedVersion | Repaired:
    """Load ``version`` of ``fragment``; when its newest round record is unreadable and no node
    wrote it, delete it (``RunStore.remove_unreadable_round``); when a blob of it is gone or
    damaged, put it back by replay (``restore_version``). Raises what neither explains."""
    try:
        return store.load_version(spec, fragment, version)
    except InvalidRecord:
        removed = store.remove_unreadable_round(fragment, version)
        if removed is None:
            raise
        log.warning("fragment %d: deleted the round record at version %d, which no node wrote: %s", fragment, version, removed)
        return Repaired(removed_round=True)
    except (KeyNotFound, CorruptPayload) as exc:
        restored = restore_version(store, backend, spec, fragment, version)
        if not restored:
            raise
        log.warning("fragment %d version %d: %s; restored %s by replaying its round", fragment, version, exc, restored)
        return Repaired(restored=tuple(restored))
