"""Tests and benchmarks drive the learner and the syncer through public seams, never their privates.

A test that reads a session's ``_run`` or calls a syncer's ``_rounds_pass()`` pins the implementation,
not the behaviour, and breaks on every refactor; the library offers the seams instead (an
exchange pass, a lease renewal, a rounds pass, ``NodeLoops.passes()``, public views). This
test collects the private names (methods, and attributes assigned on ``self``) of the classes
below from their source and fails on any read of one of them in tests/ or benchmarks/ from
outside the object itself.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

from gradientmail.session.exchange import Exchange
from gradientmail.session.fragment import LearnerFragment
from gradientmail.session.node_loops import NodeLoops
from gradientmail.session.serving import ServingRole
from gradientmail.session.session import Session
from gradientmail.session.training import OpenRun
from gradientmail.session.waits import CommitWaits
from gradientmail.store import RunStore
from gradientmail.syncer import SyncerRuntime
from gradientmail.syncer.election import Election
from gradientmail.syncer.live_set import LiveLearners
from gradientmail.syncer.round_state import FragmentRounds
from gradientmail.syncer.spread import SpreadLayout

ROOT = Path(__file__).resolve().parent.parent
GUARDED = (
    Session, OpenRun, CommitWaits, ServingRole, Exchange, LearnerFragment, NodeLoops,
    SyncerRuntime, FragmentRounds, SpreadLayout, LiveLearners, Election, RunStore,
)  # fmt: skip


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names(cls: type) -> set[str]:
    """The private methods of ``cls`` and the private attributes its methods assign on ``self``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(node.name):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and _is_private(node.attr)
        ):
            names.add(node.attr)
    return names


def test_the_guarded_classes_have_private_names_to_guard():
    assert {"_run", "_serving"} <= private_names(Session)
    assert "_upload" in private_names(Exchange)


def test_no_test_or_benchmark_reads_a_private_of_the_session_the_exchange_or_the_syncer():
    guarded = set().union(*(private_names(cls) for cls in GUARDED))
    files = sorted([*(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")])
    assert files
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or node.attr not in guarded:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue  # the test's own helper object (a wrapper's ``self._inner``)
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert not found, "private attributes read from outside (use or add a public seam):\n" + "\n".join(found)
