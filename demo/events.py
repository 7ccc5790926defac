"""The JSON lines demo processes print on stdout, and their parser: the launcher's only input.

One event per line, ``{"event": kind, "learner": id, ...}``:

* ``start``: ``framework``, ``steps``, ``batch_size``, ``tokens_per_step``, and
  ``initial_val_loss`` where the process measured it;
* ``progress``: ``step``, ``steps``, ``loss`` (mean since the last line), ``tokens``,
  ``elapsed_s``, ``steps_per_s`` and, for learners, ``versions`` (fragment → version);
* ``final``: ``steps``, ``tokens``, ``elapsed_s``, ``val_loss`` and, for learners,
  ``local_val_loss`` (own parameters before closing), ``versions``, ``contributions``,
  ``alignments``.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, TextIO

__all__ = ["emit", "parse"]


def emit(kind: str, learner: str, stream: TextIO | None = None, **fields: Any) -> None:
    """Print one event line and flush (the launcher reads it through a pipe)."""
    record = {"event": kind, "learner": learner, **{k: _plain(v) for k, v in fields.items()}}
    out = stream or sys.stdout
    out.write(json.dumps(record) + "\n")
    out.flush()


def parse(line: str) -> dict[str, Any] | None:
    """The event on ``line``, or None for anything else (a stray print, a warning)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return None
    return record


def _plain(value: Any) -> Any:
    # NaN/inf are not JSON: send them as None rather than breaking the reader
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
