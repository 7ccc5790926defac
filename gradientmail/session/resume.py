"""What a learner keeps to resume after a restart: the state the protocol does not hold.

The mailbox holds the run's committed parameters and outer state; a restarted learner aligns
with them. What it does not hold stays on the learner: the inner optimizer's moments, the
learning-rate schedule, the random generators, the learner's count of steps (its data position
and schedule position), anything else with ``state_dict()``/``load_state_dict()``. With
``SessionOptions.state_dir`` set, the session saves those to ``{state_dir}/{learner_id}.state``
(or, with ``state_dir="mailbox"``, to the learner's own prefix in the run's mailbox:
``StateInMailbox``) every ``save_state_every`` steps and at a clean close, atomically (a
temporary file, then a rename; in the mailbox a new blob, then the record naming it), and a
session with the same learner id in the same run loads them on opening:

* the objects registered with ``Session.register_for_checkpointing`` (in registration order);
* ``total_steps``: steps this learner trained in the run, across restarts
  (``Session.total_steps`` continues from it: index data and schedules by it);
* the generators of ``random``, NumPy's global one and torch's (CPU and, when present, CUDA);
* for each work queue (``Session.queue``), the step count at which the learner got each unit it
  holds: its position inside the unit (``WorkQueue.steps_into``).

Local work since the last commit is not saved: the model comes from the newest commit, as for
any joiner, so a restart redoes at most ``save_state_every`` steps of data and loses the work
the newest commit does not hold. A state saved in another run (another ``run_id``) is ignored,
with a warning. The state is a ``torch.save`` archive read back with ``weights_only=True`` where
torch is installed, else (local files only) a pickle: keep ``state_dir`` private to the learner.

Nothing in the bucket stops a learner: a state in the mailbox that does not read, verify or load
(a record of another learner, unsigned in a signed run, declaring more bytes than
``store.max_state_bytes`` allows for the run's model, a blob that is not a state) is logged and
the learner starts fresh. A local file is the learner's own: one that does not load is an
``InvalidConfig`` naming it. A save larger than that bound is refused with an ``InvalidConfig``
when it is written, not discovered at the restart.

A state in the mailbox is newest-wins by its steps, by a sequence a replay cannot undo: each
contribution the learner publishes names its newest save (``Contribution.saved_state``), and a
restart resumes from the newer of the state record and what its newest contributions name
(``store.newest_resume_point``), so an older record (and blob) put back is not resumed from. A
save keeps the one before it (which the contributions published since name), so a replay
costs at most the steps between two saves; when the save named is gone too, the learner starts
fresh with a warning. The check reads the learner's newest contribution of each fragment, so it
holds while those are kept (retention keeps a merged one ``audit_rounds`` rounds).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gradientmail.digests import DEFAULT_BLOB_DIGEST
from gradientmail.errors import GradientMailError, InvalidConfig
from gradientmail.records import SavedState, keys
from gradientmail.store import RunSpec, RunStore, max_state_bytes, newest_resume_point

__all__ = ["MAILBOX", "STATE_FORMAT", "LearnerState", "StateFile", "StateInMailbox", "Stateful", "learner_state"]

log = logging.getLogger(__name__)

STATE_FORMAT = 1


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


def check_stateful(objects: Sequence[object]) -> list[Stateful]:
    for index, obj in enumerate(objects):
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise InvalidConfig(
                "register_for_checkpointing", f"object {index} ({type(obj).__name__}) has no state_dict()/load_state_dict()"
            )
    return list(objects)  # type: ignore[arg-type]


MAILBOX = "mailbox"
"""``state_dir`` that saves the state in the run's mailbox, under the learner's own prefix."""


class StateFile:
    """A learner's state in a local file, replaced atomically (a temporary file, then a rename)."""

    def __init__(self, directory: str | Path, learner_id: str) -> None:
        self.path = Path(directory) / f"{learner_id}.state"
        self.where = str(self.path)
        self.trusted = True
        """The learner's own file: one that does not load is a configuration error."""
        self.newest: SavedState | None = None
        """Only a state in the mailbox is named by contributions."""

    def write(self, run_id: str, total_steps: int, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        with partial.open("wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, self.path)

    def read(self) -> bytes | None:
        return self.path.read_bytes() if self.path.exists() else None


class StateInMailbox:
    """A learner's state in the run's mailbox (``state_dir="mailbox"``): a blob per save and a
    record naming the newest, written last, so a kill leaves the previous save named; in a
    signed run the record is signed and pins the blob by its digest. Nothing in the bucket stops a
    learner: a state that does not read or verify is logged and the learner starts fresh.
    ``run()`` is the run's spec once joined: whether saves are compressed (its
    ``payload_compression``), what they are pinned by (its ``blob_digest``; without a run, a new
    run's) and how many bytes a state may declare (``max_state_bytes`` of its model; without a
    run, the slack alone)."""

    def __init__(self, store: RunStore, learner_id: str, run: Callable[[], RunSpec | None] = lambda: None) -> None:
        if _torch() is None:
            raise InvalidConfig("state_dir", "'mailbox' needs torch, whose restricted loader reads what the bucket holds")
        self._store = store
        self._learner = learner_id
        self._run = run
        self.where = f"the mailbox ({keys.learner_state_record(learner_id)})"
        self.trusted = False
        """Anyone with bucket access may have written it: one that does not load is ignored."""
        self.newest: SavedState | None = None
        """The save this learner last wrote or resumed from, which its contributions name."""

    @staticmethod
    def _max_bytes(spec: RunSpec | None) -> int:
        return max_state_bytes(spec.model_bytes if spec is not None else 0)

    def _spec(self) -> RunSpec | None:
        """The run's spec: ``run()``, or before the session holds it (a resume happens as the
        session opens) the mailbox's own; None where there is no run yet."""
        spec = self._run()
        if spec is None:
            try:
                spec = self._store.read_spec()
            except GradientMailError:
                return None
        return spec

    def write(self, run_id: str, total_steps: int, data: bytes) -> None:
        spec = self._spec()
        limit = self._max_bytes(spec)
        if len(data) > limit:
            raise InvalidConfig(
                "register_for_checkpointing",
                f"the learner state is {len(data)} bytes, more than the {limit} a state in the mailbox may hold "
                "for this run's model (store.max_state_bytes); save large objects elsewhere or use a local state_dir",
            )
        compress = spec is not None and spec.algorithm.payload_compression == "zstd"
        before = self.newest.state.key if self.newest is not None else None  # what contributions name until the next
        digest = spec.blob_digest if spec is not None else DEFAULT_BLOB_DIGEST  # no run yet: a new run's
        self.newest = self._store.states.save(
            self._learner, run_id, total_steps, data, digest=digest, compress=compress, keep=before
        )

    def read(self) -> bytes | None:
        spec = self._spec()
        limit = self._max_bytes(spec)
        states = self._store.states
        try:
            record = states.read_record(self._learner)
            recorded = None if record is None else SavedState(total_steps=record.total_steps, state=record.state)
            fragments = range(len(spec.fragments)) if spec is not None else range(0)
            newest = (self._store.newest_contribution(self._learner, fragment) for fragment in fragments)
            resume = newest_resume_point(recorded, [c.saved_state for c in newest if c is not None])
            if resume is None:
                return None
            if resume is not recorded:
                log.warning(
                    "the state record of %s in the mailbox is at step %s, but its contributions name a save at step %d: "
                    "resuming from that one (the record was put back or removed)",
                    self._learner,
                    "none" if recorded is None else recorded.total_steps,
                    resume.total_steps,
                )
            data = states.read_state(self._learner, resume, max_bytes=limit)
        except (GradientMailError, MemoryError) as exc:
            log.warning("ignoring the saved state of %s in the mailbox: %s", self._learner, exc)
            return None
        self.newest = resume
        return data


def learner_state(state_dir: str | None, store: RunStore, name: str, run: Callable[[], RunSpec | None]) -> LearnerState | None:
    """Where learner ``name``'s state is saved: ``state_dir``, or with ``"mailbox"`` its prefix
    in the mailbox (``run()``: the run's spec, known once joined, for its compression and the
    state's bound); None without a ``state_dir``."""
    if not state_dir:
        return None
    return LearnerState(StateInMailbox(store, name, run) if state_dir == MAILBOX else StateFile(state_dir, name), name)


class LearnerState:
    """One learner's saved state (module docstring), in a file or in the mailbox."""

    def __init__(self, where: StateFile | StateInMailbox, learner_id: str) -> None:
        self._where = where
        self.where = where.where
        """Where it is saved, for messages."""
        self.learner_id = learner_id
        self.saves = 0
        self.save_s = 0.0
        """Seconds spent saving so far (the training thread's cost)."""

    @property
    def newest(self) -> SavedState | None:
        """The save in the mailbox this learner last wrote or resumed from (what its
        contributions name); None for a local file or before any."""
        return self._where.newest

    def save(
        self, run_id: str, total_steps: int, objects: Sequence[Stateful], queues: dict[str, dict[int, int]] | None = None
    ) -> None:
        """Write the state; the previous save stays whole until the new one is complete."""
        started = time.perf_counter()
        state = {
            "format": STATE_FORMAT,
            "run_id": run_id,
            "learner_id": self.learner_id,
            "total_steps": total_steps,
            "objects": [obj.state_dict() for obj in objects],
            "rng": _rng_states(),
            "queues": {name: {int(u): int(m) for u, m in marks.items()} for name, marks in (queues or {}).items()},
        }
        self._where.write(run_id, total_steps, _dumps(state))
        self.saves += 1
        self.save_s += time.perf_counter() - started

    def load(self, run_id: str) -> dict[str, Any] | None:
        """The saved state of this learner in run ``run_id``; None when there is none."""
        data = self._where.read()
        if data is None:
            return None
        try:
            state = _loads(data)
        except Exception as exc:
            self._unreadable(f"{self.where} does not load as a learner state: {exc}")
            return None
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            self._unreadable(f"{self.where} is not a learner state file of this GradientMail")
            return None
        if state.get("run_id") != run_id:
            log.warning("ignoring %s: it was saved in run %s, this is run %s", self.where, state.get("run_id"), run_id)
            return None
        return state

    def _unreadable(self, problem: str) -> None:
        """A saved state that does not load: the learner's own file is a configuration error; one
        in the mailbox is logged and the learner starts fresh."""
        if self._where.trusted:
            raise InvalidConfig("state_dir", problem)
        log.warning("ignoring the saved state of %s: %s", self.learner_id, problem)

    @staticmethod
    def restore(state: dict[str, Any], objects: Sequence[Stateful], first: int = 0) -> None:
        """Load the saved states of ``objects`` (registered at positions ``first``, ``first`` + 1, …)."""
        saved = state["objects"]
        for offset, obj in enumerate(objects):
            position = first + offset
            if position >= len(saved):
                log.warning("nothing saved for checkpointed object %d (%s): it starts fresh", position, type(obj).__name__)
                continue
            obj.load_state_dict(saved[position])

    @staticmethod
    def restore_rng(state: dict[str, Any]) -> None:
        rng = state["rng"]
        random.setstate(_as_tuple(rng["python"]))
        kind, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
        torch = _torch()
        if torch is not None and "torch" in rng:
            torch.set_rng_state(rng["torch"])
            if rng.get("cuda") and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])


def _rng_states() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    states: dict[str, Any] = {"python": random.getstate(), "numpy": [kind, np.asarray(keys).tolist(), pos, has_gauss, cached]}
    torch = _torch()
    if torch is not None:
        states["torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _dumps(state: dict[str, Any]) -> bytes:
    torch = _torch()
    out = io.BytesIO()
    if torch is not None:
        torch.save(state, out)
    else:
        pickle.dump(state, out, protocol=pickle.HIGHEST_PROTOCOL)
    return out.getvalue()


def _loads(data: bytes) -> Any:
    torch = _torch()
    if torch is not None:
        return torch.load(io.BytesIO(data), weights_only=True)
    return pickle.loads(data)  # a local file only: the mailbox needs torch (StateInMailbox)
