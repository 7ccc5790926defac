"""Run processes side by side so that a hang fails with where it hung.

Every learner process a benchmark (or a test) starts goes through ``run_side_by_side``: each in its
own process group, with ``PYTHONFAULTHANDLER`` set. Past the timeout every group gets SIGABRT, so
each Python process, torchrun's ranks included, prints every thread's stack before it dies, and
the run fails with those stacks instead of a bare timeout (a CI run once hung past pytest's
600 s with nothing to show where)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HUNG = "the processes ran past"
"""How a run that outlived its timeout fails (followed by every process's stacks)."""
ABORT_GRACE_S = 30.0
"""How long an aborted process group has to print its stacks before SIGKILL."""


class Hung(RuntimeError):
    """The processes outlived their timeout; the message holds each one's stacks and output."""


@dataclass(frozen=True)
class Finished:
    args: list[str]
    returncode: int
    output: str
    """Standard output, with standard error in it unless ``logs`` took it."""


def run_side_by_side(
    commands: Sequence[Sequence[str]],
    timeout: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    logs: Sequence[Path] | None = None,
) -> list[Finished]:
    """Start every command at once and wait for all of them, at most ``timeout`` seconds in all.
    ``logs``: one file per command that takes its standard error (else it joins the output).
    A process that fails does not stop the others; none is left running on return or raise."""
    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
    sinks = [log.open("w") for log in logs] if logs is not None else None
    processes: list[subprocess.Popen[str]] = []
    try:
        for index, command in enumerate(commands):
            stderr = sinks[index] if sinks is not None else subprocess.STDOUT
            processes.append(
                subprocess.Popen(
                    list(command), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True
                )
            )
        deadline = time.monotonic() + timeout
        try:
            outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for p in processes]
        except subprocess.TimeoutExpired:
            tails = [_abort(p, logs[i] if logs is not None else None) for i, p in enumerate(processes)]
            raise Hung(f"{HUNG} {timeout:.0f} s; their stacks:\n" + "\n".join(tails)) from None
        return [Finished(list(p.args), p.returncode, out) for p, out in zip(processes, outputs, strict=True)]  # type: ignore[arg-type]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for sink in sinks or []:
            sink.close()


def _abort(process: subprocess.Popen[str], log: Path | None) -> str:
    """SIGABRT the process's group, give it time to print its stacks, and return its output's tail."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGABRT)
    try:
        out, _ = process.communicate(timeout=ABORT_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
    if log is not None:
        out = (out or "") + log.read_text(errors="replace")
    return f"--- {' '.join(str(a) for a in process.args[-12:])} ({process.returncode}):\n{(out or '')[-12000:]}"  # type: ignore[index]
