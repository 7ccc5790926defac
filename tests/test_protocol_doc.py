"""docs/protocol.md's invariants and the tests that prove them cite each other, so neither can drift.

A test proves an invariant by citing it (``INV-n`` as a whole token, usually in its docstring); the
doc's "proved by" column names those tests. New invariants are picked up from the doc's table.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "docs" / "protocol.md"
TESTS = ROOT / "tests"
CITATION = re.compile(r"\bINV-(\d+)\b")
TEST_NAME = re.compile(r"`(test_\w+)`")


def invariant_rows() -> dict[str, dict[str, str]]:
    """The rows of the table under "## Invariants", by invariant id, as {column header: cell}; the table must
    be one table (no row cut off by a blank line)."""
    section = PROTOCOL.read_text().split("\n## Invariants", 1)
    assert len(section) == 2, f"{PROTOCOL.name} has no '## Invariants' section"
    lines = section[1].split("\n## ", 1)[0].splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    # one table is one run of "|" lines: a row after a blank line is a paragraph of its own in Markdown
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    assert len(table) > 2, f"{PROTOCOL.name}: no invariant table under '## Invariants'"
    stray = [line.split("|")[1].strip() for line in lines[start + len(table) :] if re.match(r"\|\s*INV-\d+", line)]
    assert not stray, f"{PROTOCOL.name}: rows outside the invariant table (a blank line breaks it): {', '.join(stray)}"
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    rows: dict[str, dict[str, str]] = {}
    for line in table[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if re.fullmatch(r"INV-\d+", cells[0]):
            assert cells[0] not in rows, f"{cells[0]} is defined twice in {PROTOCOL.name}"
            rows[cells[0]] = dict(zip(header, cells, strict=False))
    assert rows, f"{PROTOCOL.name}: the invariant table defines no INV-n"
    return rows


def citing_files() -> list[Path]:
    """Every Python file under tests/ but this one (it names invariants only to check them)."""
    return sorted(p for p in TESTS.rglob("*.py") if p.resolve() != Path(__file__).resolve())


def citations() -> dict[str, set[str]]:
    """Each cited invariant id, with the files (relative to the repo) that cite it."""
    cited: dict[str, set[str]] = {}
    for path in citing_files():
        for number in CITATION.findall(path.read_text()):
            cited.setdefault(f"INV-{number}", set()).add(str(path.relative_to(ROOT)))
    return cited


def test_every_invariant_is_cited_by_a_test() -> None:
    uncited = [inv for inv in invariant_rows() if inv not in citations()]
    assert not uncited, (
        f"no test under tests/ cites {', '.join(uncited)} (docs/protocol.md's invariant table): "
        "add the id to the docstring of each test that proves it"
    )


def test_every_cited_invariant_is_defined() -> None:
    defined = invariant_rows()
    unknown = {inv: files for inv, files in citations().items() if inv not in defined}
    assert not unknown, "tests cite invariants docs/protocol.md does not define: " + "; ".join(
        f"{inv} in {', '.join(sorted(files))}" for inv, files in sorted(unknown.items())
    )


def test_the_tests_the_doc_names_cite_their_invariant() -> None:
    """A test named in an invariant's "proved by" cell exists and cites that invariant."""
    docstrings: dict[str, list[str]] = {}
    for path in citing_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                docstrings.setdefault(node.name, []).append(ast.get_docstring(node) or "")
    problems = []
    for inv, row in invariant_rows().items():
        for name in TEST_NAME.findall(row.get("proved by", "")):
            if name not in docstrings:
                problems.append(f"{inv}: `{name}` is not a test under tests/")
            elif not any(re.search(rf"\b{inv}\b", doc) for doc in docstrings[name]):
                problems.append(f"{inv}: `{name}` does not cite {inv} in its docstring")
    assert not problems, "docs/protocol.md's 'proved by' column and the tests disagree:\n" + "\n".join(problems)


# -- the "enforced by" column names what runs ---------------------------------------------------

PACKAGE = ROOT / "gradientmail"
BACKTICKED = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class Symbol:
    """What an "enforced by" name resolved to: the module that defines it, the attribute chain inside
    that module (empty for the module itself), and the lines of its definition."""

    module: str
    chain: tuple[str, ...]
    first: int
    last: int

    @property
    def path(self) -> Path:
        return MODULES[self.module]


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _defines(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The statement of ``body`` that defines ``name``: a def, a class, or an (annotated) assignment."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
    return None


def _base_name(base: ast.expr) -> str:
    return base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""


def _classes(name: str) -> list[tuple[str, tuple[str, ...], ast.ClassDef]]:
    """Every class called ``name`` in the package (module level or nested in a class), with its
    module and its chain inside the module."""
    found = []

    def visit(module: str, body: list[ast.stmt], outer: tuple[str, ...]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                if node.name == name:
                    found.append((module, (*outer, node.name), node))
                visit(module, node.body, (*outer, node.name))

    for module, tree in TREES.items():
        visit(module, tree.body, ())
    return found


def _member(module: str, outer: tuple[str, ...], cls: ast.ClassDef, chain: list[str]) -> Symbol | None:
    """``chain`` looked up in a class body, then in its bases' (by name, within the package)."""
    found = _defines(cls.body, chain[0])
    if found is None:
        for base in cls.bases:
            for base_module, base_outer, base_cls in _classes(_base_name(base)):
                inherited = _member(base_module, base_outer, base_cls, chain)
                if inherited is not None:
                    return inherited
        return None
    if len(chain) == 1:
        return Symbol(module, (*outer, chain[0]), found.lineno, found.end_lineno or found.lineno)
    return _member(module, (*outer, chain[0]), found, chain[1:]) if isinstance(found, ast.ClassDef) else None


def _in_module(module: str, chain: list[str]) -> Symbol | None:
    found = _defines(TREES[module].body, chain[0])
    if found is None:
        return None
    if len(chain) == 1:
        return Symbol(module, (chain[0],), found.lineno, found.end_lineno or found.lineno)
    return _member(module, (chain[0],), found, chain[1:]) if isinstance(found, ast.ClassDef) else None


def resolve(name: str) -> Symbol | str:
    """Where an "enforced by" name is defined, or why it could not be found.

    The rules, in order:

    1. A name that starts with a module path of the package (``syncer.rounds.validate``,
       ``records.models``, ``audit._check_chain``; the ``gradientmail.`` prefix is implied) is
       looked up in the longest such module, then attribute by attribute; what a package does not
       define itself may be what exactly one of its modules defines (``session.SyncerWatch``).
    2. A name that starts with a class name (``RunStore.commit_version``, ``Mailbox.get``) names
       the one class of that name in the package, then its members (inherited ones too).
    3. A bare name (``replay_round``, ``Exchange``, ``create``) is the one module-level class or
       function of that name; failing that, the member of the one protocol class that declares it
       (``create`` is ``Mailbox.create``, which every store implements); failing that, the member
       (method or field) of the one class that defines it (``ours_merged``: ``Commit``'s field).
    """
    parts = name.removeprefix("gradientmail.").split(".")
    depth = next((i for i in range(len(parts), 0, -1) if "gradientmail." + ".".join(parts[:i]) in MODULES), 0)
    if depth:
        module, chain = "gradientmail." + ".".join(parts[:depth]), parts[depth:]
        if not chain:
            return Symbol(module, (), 1, len(MODULES[module].read_text().splitlines()))
        found = _in_module(module, chain)
        if found is None and MODULES[module].name == "__init__.py":
            inside = [m for m in MODULES if m.startswith(module + ".") and _in_module(m, chain) is not None]
            found = _in_module(inside[0], chain) if len(inside) == 1 else None
        return found if found is not None else f"{module} defines no {'.'.join(chain)}"
    if len(parts) > 1:
        classes = _classes(parts[0])
        if len(classes) != 1:
            return f"{len(classes)} classes called {parts[0]} in the package"
        module, outer, cls = classes[0]
        return _member(module, outer, cls, parts[1:]) or f"{parts[0]} has no {'.'.join(parts[1:])}"
    top = [found for module in TREES if (found := _in_module(module, parts)) is not None]
    top = [found for found in top if isinstance(_defines(TREES[found.module].body, name), (ast.FunctionDef, ast.ClassDef))]
    if len(top) == 1:
        return top[0]
    owners = [(module, outer, cls) for module in TREES for module, outer, cls in _all_classes(module) if _defines(cls.body, name)]
    protocols = [owner for owner in owners if any(_base_name(base) == "Protocol" for base in owner[2].bases)]
    for candidates in (protocols, owners):
        if len(candidates) == 1:
            module, outer, cls = candidates[0]
            return _member(module, outer, cls, parts) or f"{cls.name} has no {name}"
    return f"{len(top)} module-level definitions and {len(owners)} classes define {name}"


def _all_classes(module: str) -> list[tuple[str, tuple[str, ...], ast.ClassDef]]:
    names = {node.name for node in ast.walk(TREES[module]) if isinstance(node, ast.ClassDef)}
    return [found for name in sorted(names) for found in _classes(name) if found[0] == module]


def exists_at_run_time(symbol: Symbol) -> bool:
    """The module imports and ``getattr`` finds each link of the chain; a dataclass field (or any
    annotated attribute) without a class-level default counts by its annotation."""
    obj: object = importlib.import_module(symbol.module)
    for attribute in symbol.chain:
        if hasattr(obj, attribute):
            obj = getattr(obj, attribute)
        else:
            return attribute in getattr(obj, "__annotations__", {})
    return True


def library_uses() -> dict[str, list[tuple[Path, int]]]:
    """Where library code uses each name: an attribute reference (calls included), a read of the name
    outside annotations, and, for modules, an import of it (by its full dotted name)."""
    used: dict[str, list[tuple[Path, int]]] = {}
    for module, tree in TREES.items():
        path = MODULES[module]
        in_annotations: set[int] = set()
        for node in ast.walk(tree):
            for note in (getattr(node, "annotation", None), getattr(node, "returns", None)):
                if isinstance(note, ast.AST):
                    in_annotations.update(id(inner) for inner in ast.walk(note))
        for node in ast.walk(tree):
            if id(node) in in_annotations:
                continue
            names: list[str] = []
            if isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                names = [node.id]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                used.setdefault(name, []).append((path, node.lineno))
    return used


def enforcer_names(cell: str) -> list[str]:
    """The backticked names of an "enforced by" cell; a trailing call is cut (``Mailbox.get(max_bytes=…)``
    names ``Mailbox.get``)."""
    return [name.split("(", 1)[0].strip() for name in BACKTICKED.findall(cell)]


def test_every_enforcer_the_doc_names_exists_and_runs() -> None:
    """Each backticked name in an "enforced by" cell is a real symbol of the package (the rules are
    :func:`resolve`'s, and it must also import and ``getattr``), and live library code uses it outside
    its own definition: a call or another attribute reference, or a read of the name (a module: an
    import of it). Prose in the cell is not checked; to name an enforcer, name its function or class."""
    used = library_uses()
    problems = []
    for inv, row in invariant_rows().items():
        for name in enforcer_names(row.get("enforced by", "")):
            if not DOTTED.fullmatch(name):
                problems.append(f"{inv}: `{name}` is not a symbol name")
                continue
            symbol = resolve(name)
            if isinstance(symbol, str):
                problems.append(f"{inv}: `{name}` does not resolve: {symbol}")
            elif not exists_at_run_time(symbol):
                problems.append(f"{inv}: `{name}` is not there at run time ({symbol.module}.{'.'.join(symbol.chain)})")
            else:
                use = ".".join((symbol.module, *symbol.chain)) if not symbol.chain else symbol.chain[-1]
                outside = [
                    (path, line)
                    for path, line in used.get(use, [])
                    if not (symbol.chain and path == symbol.path and symbol.first <= line <= symbol.last)
                ]
                if not outside:
                    problems.append(f"{inv}: `{name}` ({symbol.module}) is not used by library code outside its definition")
    assert not problems, "docs/protocol.md's 'enforced by' column names what does not run:\n" + "\n".join(problems)


def test_the_resolver_follows_its_rules() -> None:
    """Each rule of :func:`resolve` on a name the doc uses, and a name that is not there."""
    assert resolve("syncer.rounds.validate") == resolve("gradientmail.syncer.rounds.validate")
    for name, module, chain in [
        ("records.models", "gradientmail.records.models", ()),
        ("RunStore.commit_version", "gradientmail.store.run_store", ("RunStore", "commit_version")),
        ("create", "gradientmail.mailbox.base", ("Mailbox", "create")),
        ("replay_round", "gradientmail.syncer.rounds", ("replay_round",)),
    ]:
        symbol = resolve(name)
        assert isinstance(symbol, Symbol) and (symbol.module, symbol.chain) == (module, chain), name
    assert isinstance(resolve("RunStore.no_such_method"), str) and isinstance(resolve("no_such_name"), str)
