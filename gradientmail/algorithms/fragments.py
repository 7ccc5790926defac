"""The fragment plan (which parameters travel together) and the staggered schedule.

Plan, ``by_bytes`` (the default): greedy largest-first bin packing of whole tensors into
``fragments`` groups (the "balanced" strategy of Decoupled DiLoCo), deterministic: ties go to the
earlier parameter and the lower-numbered fragment. ``strided`` (Streaming DiLoCo's layout): the
model's numbered blocks (``layers.3.``, ``h.3.``: the first numeric component of a name, per
stack) are dealt round the fragments in model order, block j to fragment j mod P, so every
fragment spans the depth of the network; the parameters outside any block (embeddings, the
final norm, the head) then go largest first to the lightest fragment. Either way each fragment
lists its parameters in model order, and fragments are numbered by the model position of their
first parameter, so the plan reads in model order.

Schedule: fragment p of P (0-based) is due at local steps t > 0 with
t ≡ ⌊(p + 1)·H / P⌋ (mod H), H = sync_every. With H = 100 and P = 8 that is steps 12, 25,
37, 50, 62, 75, 87, 100, then 100 steps later again (the guide's staircase); P = 1 is one
column at 100, 200, ….
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from gradientmail.errors import InvalidConfig


@dataclass(frozen=True)
class FragmentPlan:
    """``fragments[p]`` is the ordered tuple of parameter names of fragment p."""

    fragments: tuple[tuple[str, ...], ...]

    def __len__(self) -> int:
        return len(self.fragments)

    def to_manifest(self) -> list[list[str]]:
        return [list(names) for names in self.fragments]

    @classmethod
    def from_manifest(cls, form: Sequence[Sequence[str]]) -> FragmentPlan:
        return cls(tuple(tuple(names) for names in form))


FragmentLayout = Literal["by_bytes", "strided"]
"""How parameters are grouped into fragments (``DiLoCo.fragment_layout``)."""
LAYOUTS: tuple[str, ...] = get_args(FragmentLayout)
_BLOCK = re.compile(r"^(.*?)(?:^|\.)(\d+)(?:\.|$)")
"""The stack (the name before it) and index of a parameter's first numeric component."""


def block_of(name: str) -> tuple[str, int] | None:
    """The numbered block a parameter belongs to (``("model.layers", 3)`` for
    ``model.layers.3.mlp.weight``), None outside any."""
    found = _BLOCK.match(name)
    return (found.group(1), int(found.group(2))) if found else None


def plan_fragments(sizes: Sequence[tuple[str, int]], fragments: int, layout: str = "by_bytes") -> FragmentPlan:
    """Split named parameters (name, element count) in model order into ``fragments`` groups,
    ``by_bytes`` (balanced) or ``strided`` (blocks dealt round the fragments)."""
    if layout not in LAYOUTS:
        raise InvalidConfig("fragment_layout", f"must be one of {list(LAYOUTS)}, got {layout!r}")
    if fragments < 1:
        raise InvalidConfig("fragments", f"must be at least 1, got {fragments}")
    if fragments > len(sizes):
        raise InvalidConfig("fragments", f"{fragments} fragments but the model has only {len(sizes)} parameter tensors")
    names = [name for name, _ in sizes]
    if len(set(names)) != len(names):
        raise ValueError("parameter names must be unique")
    loads = [0] * fragments
    members: list[list[int]] = [[] for _ in range(fragments)]
    rest = list(range(len(sizes)))
    if layout == "strided":
        rest = _deal_blocks(names, sizes, fragments, loads, members)
    # largest first; a stable sort keeps model order among equal sizes
    order = sorted(rest, key=lambda i: -sizes[i][1])
    for index in order:
        # emptiest bin by (load, member count, bin number): every bin gets a tensor
        target = min(range(fragments), key=lambda b: (loads[b], len(members[b]), b))
        loads[target] += sizes[index][1]
        members[target].append(index)
    groups = sorted((sorted(m) for m in members), key=lambda m: m[0])
    return FragmentPlan(tuple(tuple(names[i] for i in group) for group in groups))


def _deal_blocks(
    names: list[str], sizes: Sequence[tuple[str, int]], fragments: int, loads: list[int], members: list[list[int]]
) -> list[int]:
    """Deal the numbered blocks round the fragments (block j, in model order, to fragment j mod
    P) into ``members``/``loads``; return the parameters outside any block."""
    blocks: dict[tuple[str, int], int] = {}
    rest = []
    for index, name in enumerate(names):
        block = block_of(name)
        if block is None:
            rest.append(index)
            continue
        target = blocks.setdefault(block, len(blocks) % fragments)
        members[target].append(index)
        loads[target] += sizes[index][1]
    if len(blocks) < fragments:
        raise InvalidConfig(
            "fragment_layout",
            f"'strided' deals numbered blocks (names like 'layers.3.') round the fragments: {fragments} fragments "
            f"need at least {fragments} blocks, the model has {len(blocks)}; use 'by_bytes'",
        )
    return rest


def exchange_offset(fragment: int, fragments: int, sync_every: int) -> int:
    """The step within each period at which ``fragment`` is due (0 means the period's end)."""
    return ((fragment + 1) * sync_every // fragments) % sync_every


def is_due(step: int, fragment: int, fragments: int, sync_every: int) -> bool:
    """Whether ``fragment`` is exchanged at local step ``step`` (steps count from 1)."""
    return step > 0 and step % sync_every == exchange_offset(fragment, fragments, sync_every)


def due_fragments(step: int, fragments: int, sync_every: int) -> list[int]:
    """The fragments exchanged at local step ``step``."""
    return [p for p in range(fragments) if is_due(step, p, fragments, sync_every)]


def exchange_steps(fragment: int, fragments: int, sync_every: int, until: int) -> list[int]:
    """Every step ≤ ``until`` at which ``fragment`` is exchanged."""
    return [t for t in range(1, until + 1) if is_due(t, fragment, fragments, sync_every)]
