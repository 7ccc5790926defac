"""What a learner keeps to resume after a restart: the state the protocol does not hold.

The mailbox holds the run's committed parameters and outer state; a restarted learner aligns
with them. What it does not hold stays on the learner: the inner optimizer's moments, the
learning-rate schedule, the random generators, the learner's count of steps (its data position
and schedule position), anything else with ``state_dict()``/``load_state_dict()``. With
``SessionOptions.state_dir`` set, the session saves those to ``{state_dir}/{learner_id}.state``
every ``save_state_every`` steps and at a clean close, atomically (a temporary file, then a
rename), and a session with the same learner id in the same run loads them on opening:

* the objects registered with ``Session.register_for_checkpointing`` (in registration order);
* ``total_steps``: steps this learner trained in the run, across restarts
  (``Session.total_steps`` continues from it: index data and schedules by it);
* the generators of ``random``, NumPy's global one and torch's (CPU and, when present, CUDA).

Local work since the last commit is not saved: the model comes from the newest commit, as for
any joiner, so a restart redoes at most ``save_state_every`` steps of data and loses the work
the newest commit does not hold. A state saved in another run (another ``run_id``) is ignored,
with a warning. The file is a ``torch.save`` archive read back with ``weights_only=True`` where
torch is installed, else a pickle: keep ``state_dir`` private to the learner.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gradientmail.errors import InvalidConfig

__all__ = ["STATE_FORMAT", "LearnerState", "Stateful"]

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


class LearnerState:
    """One learner's state file (module docstring)."""

    def __init__(self, directory: str | Path, learner_id: str) -> None:
        self.path = Path(directory) / f"{learner_id}.state"
        self.learner_id = learner_id
        self.saves = 0
        self.save_s = 0.0
        """Seconds spent saving so far (the training thread's cost)."""

    def save(self, run_id: str, total_steps: int, objects: Sequence[Stateful]) -> None:
        """Write the state atomically (the previous file stays whole until the rename)."""
        started = time.perf_counter()
        state = {
            "format": STATE_FORMAT,
            "run_id": run_id,
            "learner_id": self.learner_id,
            "total_steps": total_steps,
            "objects": [obj.state_dict() for obj in objects],
            "rng": _rng_states(),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        _dump(state, partial)
        os.replace(partial, self.path)
        self.saves += 1
        self.save_s += time.perf_counter() - started

    def load(self, run_id: str) -> dict[str, Any] | None:
        """The saved state of this learner in run ``run_id``; None when there is none."""
        if not self.path.exists():
            return None
        state = _load(self.path)
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise InvalidConfig("state_dir", f"{self.path} is not a learner state file of this GradientMail")
        if state.get("run_id") != run_id:
            log.warning("ignoring %s: it was saved in run %s, this is run %s", self.path, state.get("run_id"), run_id)
            return None
        return state

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


def _dump(state: dict[str, Any], path: Path) -> None:
    torch = _torch()
    with path.open("wb") as out:
        if torch is not None:
            torch.save(state, out)
        else:
            pickle.dump(state, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()
        os.fsync(out.fileno())


def _load(path: Path) -> Any:
    torch = _torch()
    with path.open("rb") as source:
        if torch is not None:
            return torch.load(source, weights_only=True)
        return pickle.load(source)
