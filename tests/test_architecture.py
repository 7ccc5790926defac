"""The layers of docs/architecture.md, enforced on the code: imports only go down, and never in a circle.

The layer table is written once here, as data, and checked against the doc's table, so the doc and
this test cannot drift. Every module under ``gradientmail/`` must belong to a layer.

Every import statement counts, wherever it stands: at module level, inside a function or method
(a deferred import), or under ``if TYPE_CHECKING:``. A deferred import only postpones a circle to
the first call, and a type-only one is still a dependency of the design, so neither may go up a
layer or close a circle. Circles are found at any length (the strongly connected components of the
module graph), not only between pairs. Imports by computed name (``importlib.import_module``) are
not seen.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gradientmail"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Top to bottom, as in docs/architecture.md: a module may import its own layer or a lower one.
# An entry ending in "/" is a folder (every module under it); any other entry is one file.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "entry points",
        (
            "gradientmail/__init__.py",
            "gradientmail/cli.py",
            "gradientmail/audit.py",
            "gradientmail/minio_setup.py",
            "gradientmail/seaweedfs_setup.py",
            "gradientmail/node.py",
            "gradientmail/settings.py",
            "gradientmail/regime.py",
            "gradientmail/simulate/",
        ),
    ),
    ("session", ("gradientmail/session/",)),
    ("syncer", ("gradientmail/syncer/",)),
    ("telemetry", ("gradientmail/telemetry/",)),
    ("store", ("gradientmail/store/",)),
    ("algorithms", ("gradientmail/algorithms/",)),
    ("backends", ("gradientmail/backends/",)),
    ("records", ("gradientmail/records/",)),
    ("mailbox", ("gradientmail/mailbox/",)),
    (
        "foundation",
        (
            "gradientmail/errors.py",
            "gradientmail/polling.py",
            "gradientmail/_version.py",
            "gradientmail/memory.py",
            "gradientmail/digests.py",
            "gradientmail/cores.py",
        ),
    ),
)


@dataclass(frozen=True)
class Import:
    """One import of a gradientmail module; ``at_import_time`` is false inside functions and TYPE_CHECKING
    blocks (such an import still counts; the flag only tells the failure message where to look)."""

    source: str
    target: str
    at_import_time: bool


def layer_of(relative: str) -> int | None:
    """The index in LAYERS of a file given relative to the repo root; a file entry beats a folder."""
    for index, (_, entries) in enumerate(LAYERS):
        if relative in entries:
            return index
    matches = [
        (len(entry), index)
        for index, (_, entries) in enumerate(LAYERS)
        for entry in entries
        if entry.endswith("/") and relative.startswith(entry)
    ]
    return max(matches)[1] if matches else None


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__.py)."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement at any depth, with whether it runs when the module is imported."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, at_import_time: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, at_import_time))
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            at_import_time = False
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for statement in node.body:
                visit(statement, False)
            for statement in node.orelse:
                visit(statement, at_import_time)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, at_import_time)

    visit(tree, True)
    return found


def _known(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of a dotted name that is a module of the package."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def imports(known: dict[str, Path], top: str = "gradientmail") -> list[Import]:
    """Every import from one gradientmail module of another, relative imports resolved.

    ``from P import X`` goes to the module P.X when there is one, else to P. ``from gradientmail import X``
    also goes to gradientmail/__init__.py, the entry layer: the public API is for users, not for the layers.
    """
    found: list[Import] = []
    for source, path in known.items():
        is_package = path.name == "__init__.py"
        for node, at_import_time in _import_nodes(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    package = source if is_package else source.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{node.module}" if node.module else package
                else:
                    base = node.module or ""
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
                if base == top:
                    targets.append(base)
            for target in targets:
                if target != top and not target.startswith(f"{top}."):
                    continue
                resolved = _known(target, known)
                if resolved is not None and resolved != source:
                    found.append(Import(source, resolved, at_import_time))
    return found


def layer_of_module(name: str, known: dict[str, Path]) -> int | None:
    return layer_of(known[name].relative_to(ROOT).as_posix())


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted; only those with a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _one_cycle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module, for the failure message."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & members):
            if child == start:
                return [*paths[node], start]
            if child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    return component


def doc_layers() -> list[tuple[str, tuple[str, ...]]]:
    """(layer, its backticked modules) for each row of docs/architecture.md's layer table."""
    lines = [line for line in ARCHITECTURE.read_text().splitlines() if line.startswith("|")]
    header = [cell.strip().lower() for cell in lines[0].strip("|").split("|")] if lines else []
    assert "layer" in header and "modules" in header, "docs/architecture.md needs a table with 'layer' and 'modules' columns"
    layer_column, modules_column = header.index("layer"), header.index("modules")
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != len(header):
            break  # the end of the first table
        rows.append((cells[layer_column].strip("`* "), tuple(re.findall(r"`(gradientmail/[^`]*)`", cells[modules_column]))))
    return rows


def test_the_doc_lists_the_same_layers_in_the_same_order() -> None:
    assert doc_layers() == [(name, entries) for name, entries in LAYERS], (
        "docs/architecture.md's layer table and LAYERS in tests/test_architecture.py differ: change both together"
    )


def test_every_module_belongs_to_a_layer() -> None:
    known = modules()
    homeless = [
        f"{path.relative_to(ROOT).as_posix()} ({name})" for name, path in known.items() if layer_of_module(name, known) is None
    ]
    assert not homeless, (
        "modules in no layer; add each to the layer table of docs/architecture.md "
        "(and to LAYERS in tests/test_architecture.py):\n" + "\n".join(homeless)
    )


def test_imports_only_go_to_the_same_or_a_lower_layer() -> None:
    known = modules()
    upward = set()
    for found in imports(known):
        source_layer, target_layer = layer_of_module(found.source, known), layer_of_module(found.target, known)
        if source_layer is not None and target_layer is not None and target_layer < source_layer:
            upward.add(f"{found.source} -> {found.target} ({LAYERS[source_layer][0]} -> {LAYERS[target_layer][0]})")
    assert not upward, "imports that go up a layer (docs/architecture.md):\n" + "\n".join(sorted(upward))


def import_graph(known: dict[str, Path], top: str = "gradientmail") -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """Every module's imports as a graph (all of them: module level, inside functions, TYPE_CHECKING),
    and the edges made only of deferred or type-only imports."""
    graph: dict[str, set[str]] = {name: set() for name in known}
    eager: set[tuple[str, str]] = set()
    for found in imports(known, top):
        graph[found.source].add(found.target)
        if found.at_import_time:
            eager.add((found.source, found.target))
    deferred = {(source, target) for source, targets in graph.items() for target in targets} - eager
    return graph, deferred


@pytest.mark.parametrize("top", ["gradientmail", "benchmarks", "testing"])
def test_no_import_cycles(top: str) -> None:
    """No circle of any length, counting imports inside functions and under TYPE_CHECKING too: a deferred
    import is a circle that waits for its first call, and a type-only one still ties the layers together.
    The same holds among the benchmarks and in the harness they share with the tests."""
    known = modules(ROOT / top)
    graph, deferred = import_graph(known, top)
    cycles = []
    for component in strongly_connected(graph):
        cycle = _one_cycle(component, graph)
        steps = [f"{a} -> {b}" + (" (deferred)" if (a, b) in deferred else "") for a, b in zip(cycle, cycle[1:], strict=False)]
        cycles.append("; ".join(steps) + f"  (cycle among {', '.join(component)})")
    assert not cycles, "import cycles among modules (docs/architecture.md):\n" + "\n".join(cycles)


def test_the_harness_stands_below_the_benchmarks_and_the_tests() -> None:
    """``testing/`` is shared: it imports neither the benchmarks nor the tests, and the library none of them."""
    found = []
    for top, others in (("testing", ("benchmarks", "tests")), ("gradientmail", ("benchmarks", "tests", "testing"))):
        for name, path in modules(ROOT / top).items():
            for node, _ in _import_nodes(ast.parse(path.read_text(), str(path))):
                targets = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{name} -> {t}" for t in targets if t.split(".")[0] in others]
    assert not found, "imports above the shared harness:\n" + "\n".join(found)


def test_the_cycle_check_sees_deferred_imports_and_long_cycles() -> None:
    """The checker itself: a three-module circle closed by an import inside a function is found."""
    tree = ast.parse("def f():\n    from gradientmail.c import x\nif TYPE_CHECKING:\n    import gradientmail.d\n")
    found = _import_nodes(tree)
    assert [at_import_time for _, at_import_time in found] == [False, False]
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert _one_cycle(["a", "b", "c"], graph) == ["a", "b", "c", "a"]


def test_the_contribution_path_names_modules_that_exist() -> None:
    """docs/architecture.md's picture of a contribution's path names a module at every stage."""
    text = ARCHITECTURE.read_text()
    picture = text.split("## A contribution's path", 1)[1].split("```", 2)[1]
    named = re.findall(r"\b([a-z_]+/[a-z_]+\.py)\b", picture)
    assert len(named) >= 10, "the picture names the module of each stage"
    missing = [path for path in named if not (PACKAGE / path).is_file()]
    assert not missing, f"the contribution's path names modules that are not there: {missing}"
