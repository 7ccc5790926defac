"""What the demo shows: one status line per process, a line per committed round, a final table.

On a terminal the status lines are redrawn in place below the scrolling round lines; into a
pipe or file (CI, tests) every line is plain text and status lines come out periodically.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from gradientmail.records import RoundRecord

__all__ = ["ProcessState", "Display", "format_round", "summarize_rounds", "format_results"]

_BAR_WIDTH = 20


@dataclass
class ProcessState:
    """The newest known facts about one child, folded from its events."""

    name: str
    role: str
    framework: str = "?"
    step: int = 0
    steps: int = 0
    loss: float | None = None
    steps_per_s: float | None = None
    versions: dict[str, int] = field(default_factory=dict)
    final: dict[str, Any] | None = None
    start: dict[str, Any] | None = None
    returncode: int | None = None

    def apply(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "start":
            self.start = event
            self.framework = event.get("framework", self.framework)
            self.steps = event.get("steps", self.steps)
        elif kind == "progress":
            self.step, self.steps = event["step"], event.get("steps", self.steps)
            self.loss, self.steps_per_s = event.get("loss"), event.get("steps_per_s")
            self.versions = event.get("versions") or {}
        elif kind == "final":
            self.final = event
        elif kind == "exit":
            self.returncode = event["returncode"]

    def line(self) -> str:
        if self.start is None:
            return f"{self.name:<10} {'FAILED (exit ' + str(self.returncode) + ')' if self.returncode else 'starting'}"
        done = self.step / self.steps if self.steps else 0.0
        filled = round(done * _BAR_WIDTH)
        bar = "█" * filled + "░" * (_BAR_WIDTH - filled)
        text = f"{self.name:<10} {self.framework:<5} {bar} {self.step:>5}/{self.steps:<5}"
        if self.loss is not None:
            text += f" loss {self.loss:5.3f}"
        if self.steps_per_s is not None:
            text += f"  {self.steps_per_s:4.1f} steps/s"
        if self.versions:
            text += "  " + " ".join(f"f{f}:v{v}" for f, v in sorted(self.versions.items(), key=lambda kv: int(kv[0])))
        if self.final is not None and self.final.get("val_loss") is not None:
            text += f"  done, val {self.final['val_loss']:.3f}"
        elif self.returncode not in (None, 0):
            text += f"  FAILED (exit {self.returncode})"
        return text


def format_round(record: RoundRecord) -> str:
    """One line per commit: fragment, version, participants with weight shares, rejections."""
    if record.version == 0:
        return f"round  f{record.fragment} v0      initial parameters, committed by {record.committed_by}"
    total = sum(p.weight for p in record.participants) or 1.0
    who = "  ".join(
        f"{p.learner} w={p.weight / total:.2f} ({p.steps} step{'s' if p.steps != 1 else ''})" for p in record.participants
    )
    text = f"round  f{record.fragment} v{record.version:<5} from v{record.base_version}  {who}"
    if record.rejected:
        text += "  rejected: " + ", ".join(f"{r.learner} ({r.reason})" for r in record.rejected)
    if record.final:
        text += "  [final]"
    return text


def summarize_rounds(records: list[RoundRecord]) -> str:
    """Commits per fragment, contributions merged per learner, rejections by reason."""
    commits = [r for r in records if r.version > 0]
    per_fragment: dict[int, int] = {}
    merged: dict[str, int] = {}
    rejected: dict[str, int] = {}
    for record in commits:
        per_fragment[record.fragment] = max(per_fragment.get(record.fragment, 0), record.version)
        for participant in record.participants:
            merged[participant.learner] = merged.get(participant.learner, 0) + 1
        for rejection in record.rejected:
            rejected[rejection.reason] = rejected.get(rejection.reason, 0) + 1
    fragments = ", ".join(f"f{f}: v{v}" for f, v in sorted(per_fragment.items())) or "none"
    learners = ", ".join(f"{name} {count}" for name, count in sorted(merged.items())) or "none"
    refused = ", ".join(f"{count} {reason}" for reason, count in sorted(rejected.items())) or "none"
    return f"rounds    {len(commits)} commits (newest {fragments}); contributions merged: {learners}; rejected: {refused}"


def merged_share(records: list[RoundRecord], learner_steps: int, fragments: int) -> float:
    """Learner steps that reached a commit, over every step every learner trained, per fragment."""
    merged = sum(p.steps for r in records if r.version > 0 for p in r.participants)
    return merged / (learner_steps * fragments) if learner_steps and fragments else 0.0


def format_results(
    initial: float | None,
    learners: list[ProcessState],
    committed: float | None,
    baseline: ProcessState | None,
    reference: ProcessState | None = None,
    share_merged: float | None = None,
) -> list[str]:
    """The closing table: validation loss of every model the run produced, the baseline's and,
    when it ran, synchronous DiLoCo's; then the share of learner steps merged."""

    def value(loss: float | None) -> str:
        return f"{loss:7.3f}" if loss is not None else "      -"

    rows: list[tuple[str, float | None]] = [("initial model (before training)", initial)]
    for state in learners:
        final = state.final or {}
        rows.append((f"{state.name} ({state.framework}): own parameters at its last step", final.get("local_val_loss")))
        rows.append((f"{state.name}: committed model when it left", final.get("val_loss")))
    rows.append(("committed model at the end of the run", committed))
    if baseline is not None and baseline.final is not None:
        start = baseline.start or {}
        label = f"single learner, no exchange ({baseline.final.get('tokens', 0):,} tokens, batch {start.get('batch_size', '?')})"
        rows.append((label, baseline.final.get("val_loss")))
    if reference is not None and reference.final is not None:
        start = reference.start or {}
        label = f"synchronous DiLoCo, same learners, H and outer step ({start.get('replicas', '?')} replicas in lock-step)"
        rows.append((label, reference.final.get("val_loss")))
    width = max(len(label) for label, _ in rows)
    lines = ["validation loss (next-byte cross-entropy, nats; ln 256 = 5.545 is a uniform guess)"] + [
        f"  {label:<{width}}  {value(loss)}" for label, loss in rows
    ]
    if reference is None:
        lines.append("  (synchronous DiLoCo reference: add --sync-reference; it costs about half the run's time again)")
    if share_merged is not None:
        lines.append(f"learner steps merged into commits: {100 * share_merged:.1f} %")
    return lines


class Display:
    """Writes round lines as they come and keeps the status lines current."""

    def __init__(self, states: list[ProcessState], stream: TextIO | None = None, plain_every_s: float = 15.0) -> None:
        self.states = states
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self.plain_every_s = plain_every_s
        self._drawn = 0
        self._shown: list[str] = []
        self._last_plain = time.monotonic()

    def message(self, text: str) -> None:
        """A line that stays (a round, a note): above the live status lines on a terminal."""
        self._erase()
        self.stream.write(text + "\n")
        self.refresh(force=self.live)

    def refresh(self, force: bool = False) -> None:
        """Redraw the status lines (terminal) or print them every ``plain_every_s`` (pipe)."""
        if self.live:
            width = shutil.get_terminal_size().columns - 1  # a wrapped line would break the redraw
            lines = [state.line()[:width] for state in self.states]
            if lines == self._shown and self._drawn and not force:
                return
            self._erase()
            self.stream.write("".join(f"\x1b[2K{line}\n" for line in lines))
            self._drawn, self._shown = len(lines), lines
        elif force or time.monotonic() - self._last_plain >= self.plain_every_s:
            self._last_plain = time.monotonic()
            for state in self.states:
                self.stream.write(f"status {state.line()}\n")
        self.stream.flush()

    def finish(self) -> None:
        """Leave the last status lines on screen (terminal) or print them once more (pipe)."""
        self.refresh(force=True)
        self._drawn = 0

    def _erase(self) -> None:
        if self.live and self._drawn:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")  # up to the first status line, clear below
            self._drawn = 0
