"""Start the demo's processes and turn their stdout into events on one queue.

Each child is ``python -m demo.<module> ...``; its events are also kept in
``logs/<name>.jsonl`` and its stderr (logging, tracebacks) in ``logs/<name>.log``. The
children get the folder holding ``demo`` on ``PYTHONPATH``, so they import it from any
working directory.
"""

from __future__ import annotations

import math
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from demo import events

__all__ = ["Child", "Launcher", "share_cores"]

JOBS_DIR = Path(__file__).resolve().parent.parent
"""The folder that holds the ``demo`` package (the repository root, or the images' jobs folder)."""

Event = tuple[str, dict[str, Any]]
"""(process name, event); the event ``{"event": "exit", "returncode": n}`` ends each stream."""


@dataclass
class Child:
    name: str
    process: subprocess.Popen[str]
    log_path: Path
    reader: threading.Thread = field(repr=False)

    def stderr_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def share_cores(cores: int, learners: int) -> tuple[int, int]:
    """(niceness for each learner, PyTorch threads for the baseline) on a machine of ``cores``.

    The baseline does as much work as all learners together in one process. With a core to
    spare for each, it gets the leftover cores as threads. With fewer (the 2-core case),
    the learners are niced so the scheduler leaves the single-threaded baseline about one
    core: on 2 cores everyone then finishes at about the same time instead of the baseline
    crawling at a fair share and running on alone afterwards. Each nice level is ~1.25×
    less CPU weight under Linux's scheduler.
    """
    if cores >= learners + 2:
        return 0, min(cores - learners, 4)
    if cores <= 1:
        return 0, 1
    return math.ceil(math.log(learners / (cores - 1)) / math.log(1.25) - 1e-9), 1


def _with_jobs_dir(pythonpath: str | None) -> str:
    """``PYTHONPATH`` with :data:`JOBS_DIR` first: ``demo`` is not installed, only on a path."""
    return os.pathsep.join([str(JOBS_DIR), *(pythonpath.split(os.pathsep) if pythonpath else [])])


class Launcher:
    """Owns the children: start, collect events, stop them all on the way out."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.events: queue.Queue[Event] = queue.Queue()
        self.children: dict[str, Child] = {}

    def start(self, name: str, module: str, args: list[str]) -> Child:
        """Run ``python -m demo.<module> args`` with the current interpreter."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=_with_jobs_dir(os.environ.get("PYTHONPATH")))
        with open(log_path, "w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", f"demo.{module}", *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
            )
        assert process.stdout is not None
        reader = threading.Thread(target=self._read, args=(name, process, process.stdout), daemon=True)
        child = Child(name, process, log_path, reader)
        self.children[name] = child
        reader.start()
        return child

    def _read(self, name: str, process: subprocess.Popen[str], stdout: IO[str]) -> None:
        with open(self.log_dir / f"{name}.jsonl", "w") as keep:
            for line in stdout:
                event = events.parse(line)
                if event is not None:
                    keep.write(line)
                    keep.flush()
                    self.events.put((name, event))
        self.events.put((name, {"event": "exit", "returncode": process.wait()}))

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """Terminate children still running (an error or Ctrl-C elsewhere), then kill stragglers."""
        running = [c for c in self.children.values() if c.process.poll() is None]
        for child in running:
            child.process.terminate()
        for child in running:
            try:
                child.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
