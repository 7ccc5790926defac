"""docs/protocol.md's invariants and the tests that prove them cite each other, so neither can drift.

A test proves an invariant by citing it (``INV-n`` as a whole token, usually in its docstring); the
doc's "proved by" column names those tests. New invariants are picked up from the doc's table.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "docs" / "protocol.md"
TESTS = ROOT / "tests"
CITATION = re.compile(r"\bINV-(\d+)\b")
TEST_NAME = re.compile(r"`(test_\w+)`")


def invariant_rows() -> dict[str, dict[str, str]]:
    """The rows of the table under "## Invariants", by invariant id, as {column header: cell}."""
    section = PROTOCOL.read_text().split("\n## Invariants", 1)
    assert len(section) == 2, f"{PROTOCOL.name} has no '## Invariants' section"
    table = [line for line in section[1].split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    assert len(table) > 2, f"{PROTOCOL.name}: no invariant table under '## Invariants'"
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
