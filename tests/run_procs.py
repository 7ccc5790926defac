"""Start and watch real learner processes for the multi-process tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gradientmail.mailbox import Mailbox
from gradientmail.records import Lease, RoundRecord, keys
from gradientmail.store import RunStore
from testing.processes import Hung, run_side_by_side

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Learner:
    name: str
    process: subprocess.Popen[str]
    out: Path
    log: Path

    def result(self) -> dict:
        return json.loads(self.out.read_text())

    def wait(self, timeout: float = 120.0) -> int:
        code = self.process.wait(timeout=timeout)
        assert code == 0, f"{self.name} exited with {code}:\n{self.log.read_text()[-3000:]}"
        return code

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no clean-up, no lease release
        self.process.wait()


def start_learner(url: str, name: str, workdir: Path, *args: str, env: dict[str, str] | None = None) -> Learner:
    out, log = workdir / f"{name}.json", workdir / f"{name}.log"
    command = [sys.executable, "-m", "tests.learner_proc", "--mailbox", url, "--learner-id", name, "--out", str(out), *args]
    handle = log.open("w")
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}
    )
    return Learner(name, process, out, log)


def wait_until(condition: Callable[[], object], timeout: float, what: str, every: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def rounds(mailbox: Mailbox, fragment: int) -> list[RoundRecord]:
    store = RunStore(mailbox)
    return [store.read_round(fragment, version) for version in store.committed_versions(fragment)]


def syncer_lease(mailbox: Mailbox) -> Lease | None:
    found = RunStore(mailbox).leases.read(keys.SYNCER_LEASE)
    return found.lease if found is not None else None


def check_history(mailbox: Mailbox, fragments: int) -> list[list[RoundRecord]]:
    """INV-1, INV-11: every fragment's versions are 0..N, each committed once, each built on the one
    before and naming its digest (the learners keep every version unless told otherwise)."""
    history = []
    store = RunStore(mailbox)
    for fragment in range(fragments):
        records = rounds(mailbox, fragment)
        assert [r.version for r in records] == list(range(len(records)))
        for record in records[1:]:
            assert record.base_version == record.version - 1
            assert record.participants, f"version {record.version} has no participants"
            assert mailbox.exists(record.params.key) and mailbox.exists(record.outer_state.key)
            assert record.previous == store.read_stored_round(fragment, record.version - 1).sha256
        history.append(records)
    return history


def unique_prefix() -> str:
    return f"runs/{uuid.uuid4().hex[:12]}"


GLOO_EXIT_ABORT = "terminate called without an active exception"
"""What a gloo rank prints when it aborts (SIGABRT) as a two-rank run ends: seen in about one in
ten two-rank runs under the loaded test suite, never alone. Probably the abort twin of the exit
deadlock ``session/group.py`` now avoids (gloo's worker thread freeing the last collectives'
tensors while the exiting main thread holds the GIL: 4 of 15 loaded two-rank runs hung at exit
without the fix, 0 of 15 with it); kept as a guard until runs show it gone. A launch that fails
with it is tried once more; any other failure, or the same one twice, fails the test. A group that
cannot be launched again (it trains beside other groups of a running test, as in
``tests/test_torchrun_learner.py``; seen there on 2026-12-07 after an FSDP2 group's restart) passes
with it only when both its ranks had written their results for every step first."""


def run_torchrun(
    command: list[str],
    timeout: float,
    retry_on: tuple[str, ...] = (GLOO_EXIT_ABORT,),
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """A torchrun launch (``testing/processes.py``: past ``timeout`` it fails with every rank's
    stacks, ``HUNG`` in its output), tried a second time only after a failure whose output holds
    one of ``retry_on``; the first failure's output is then a warning, so a retried launch still
    says what went wrong. Standard error is part of ``stdout``."""

    def launch() -> subprocess.CompletedProcess[str]:
        try:
            (done,) = run_side_by_side([command], timeout, env=env, cwd=cwd)
        except Hung as hung:
            return subprocess.CompletedProcess(command, -int(signal.SIGABRT), str(hung), "")
        return subprocess.CompletedProcess(command, done.returncode, done.output, "")

    done = launch()
    if done.returncode != 0 and any(marker in done.stdout for marker in retry_on):
        message = f"{command[:4]} failed ({done.returncode}); tried once more. Its output:\n{done.stdout[-8000:]}"
        warnings.warn(message, stacklevel=2)
        done = launch()
    return done
