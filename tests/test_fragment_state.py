"""Per-fragment state lives on the fragment's object, never in a container on an orchestrator.

``LearnerFragment`` (the learner) and ``FragmentRounds`` (the syncer) each hold one fragment's
state; the orchestrators (``Session`` and its ``OpenRun``, ``Exchange``, ``NodeLoops``,
``SyncerRuntime``, ``RunStore``) hold lists of them, never a dict or set keyed by fragment
(``dict[int, …]``, ``set[tuple[int, …]]``), where the state of one fragment is spread over
many containers and each new feature adds another. This test fails when one is added: from the
annotations in the source (an unannotated dict or set is a failure too: say what it is keyed
by), and from the objects of a real run after a few rounds.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Mapping, Set

import numpy as np

import gradientmail as gm
from gradientmail.mailbox import MemoryMailbox
from gradientmail.session.exchange import Exchange
from gradientmail.session.node_loops import NodeLoops
from gradientmail.session.session import Session
from gradientmail.session.training import OpenRun
from gradientmail.store import RunStore
from gradientmail.syncer import SyncerRuntime
from testing.mailbox_run import create_run

ORCHESTRATORS = (Session, OpenRun, Exchange, NodeLoops, SyncerRuntime, RunStore)
KEYED = ("dict", "set", "frozenset", "Mapping", "MutableMapping", "defaultdict", "Counter", "OrderedDict", "Set")


def _outer(annotation: ast.expr) -> list[ast.expr]:
    """The types an attribute holds itself: ``A | B`` is A and B; what they hold does not count
    (a dict keyed by name whose values are keyed by unit is no fragment's)."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _outer(annotation.left) + _outer(annotation.right)
    return [annotation]


def _fragment_keyed(annotation: ast.expr) -> bool:
    """Whether a type annotation is a container keyed by int or by a tuple starting with int."""
    for node in _outer(annotation):
        if not (isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] in KEYED):
            continue
        key = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
        text = ast.unparse(key).replace(" ", "")
        if text == "int" or text.startswith(("tuple[int,", "tuple[int]")):
            return True
    return False


def container_attributes(cls: type) -> list[str]:
    """``cls``'s attributes (assigned on ``self``, or dataclass fields) that are keyed by fragment,
    or are a dict or set without an annotation saying what they are keyed by."""
    found = []
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            target = node.target
            on_self = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
            field = isinstance(target, ast.Name) and dataclasses.is_dataclass(cls)
            if (on_self or field) and _fragment_keyed(node.annotation):
                found.append(f"{cls.__name__}.{ast.unparse(target)}: {ast.unparse(node.annotation)}")
        elif isinstance(node, ast.Assign):
            bare = isinstance(node.value, (ast.Dict, ast.Set, ast.DictComp, ast.SetComp)) or (
                isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in ("dict", "set")
            )
            for target in node.targets:
                if bare and isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                    found.append(f"{cls.__name__}.{target.attr} = {ast.unparse(node.value)[:40]} (say what it is keyed by)")
    return found


def test_no_orchestrator_declares_a_fragment_keyed_container() -> None:
    found = [entry for cls in ORCHESTRATORS for entry in container_attributes(cls)]
    assert not found, "per-fragment state belongs on LearnerFragment / FragmentRounds:\n" + "\n".join(found)


def test_the_check_finds_the_containers_it_forbids() -> None:
    class Orchestrator:
        def __init__(self) -> None:
            self.views: dict[int, str] = {}
            self.seen: set[tuple[int, str]] = set()
            self.bare = {}
            self.by_learner: dict[str, int] = {}

    live = Orchestrator()
    live.views[1] = "v"
    live.seen.add((0, "k"))
    live.by_learner["alice"] = 3
    assert [e.split(":")[0] for e in _fragment_keyed_values(live, 2)] == ["Orchestrator.views", "Orchestrator.seen"]
    found = container_attributes(Orchestrator)
    assert [entry.split(":")[0].split(" ")[0] for entry in found] == [
        "Orchestrator.self.views",
        "Orchestrator.self.seen",
        "Orchestrator.bare",
    ]


def _fragment_keyed_values(obj: object, fragments: int) -> list[str]:
    """The attributes of a live object that are dicts or sets holding fragment keys."""
    found = []
    for name, value in vars(obj).items():
        keys = list(value) if isinstance(value, Mapping | Set) else []
        first = [k[0] if isinstance(k, tuple) and k else k for k in keys]
        if any(isinstance(k, int) and not isinstance(k, bool) and 0 <= k < fragments for k in first):
            found.append(f"{type(obj).__name__}.{name}: {sorted(map(repr, keys))[:4]}")
    return found


def test_a_syncer_and_a_session_after_rounds_hold_no_fragment_keyed_container() -> None:
    run = create_run(MemoryMailbox())
    for _ in range(3):
        run.honest_round()
    fragments = len(run.spec.fragments)
    model = {f"layer{i}.weight": np.zeros((4, 4), dtype=np.float32) for i in range(4)}
    algorithm = gm.DiLoCo(sync_every=4, fragments=2, quorum_size=1)
    options = gm.SessionOptions(poll_interval_s=0.01, lease_ttl_s=1.0)
    with gm.Session(model, algorithm=algorithm, mailbox=MemoryMailbox(), learner_id="solo", options=options) as session:
        for _ in range(12):
            session.step()
        session.wait_published(5.0)
        held = [session, session.syncer]
    assert held[1] is not None
    found = _fragment_keyed_values(run.syncer, fragments) + [e for obj in held for e in _fragment_keyed_values(obj, 2)]
    assert not found, "fragment-keyed containers on orchestrators after a run:\n" + "\n".join(found)
