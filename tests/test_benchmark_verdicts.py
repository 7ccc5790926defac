"""docs/benchmarks.md is a reference: one table of the current verdict of every target, each row
pointing at the run it comes from in the log (docs/benchmarks-log.md).

The table is checked against the log: every row names a benchmark there is (a module with a
command line, or the main job), a verdict of the three kinds ``benchmarks/targets.py`` prints,
and a section of the log whose text holds the row's figure and date; every benchmark with a
command line has a row. A rerun that changes a figure adds its dated section to the log and
moves the row; a row whose figure its section does not print fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.__main__ import benchmarks

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "benchmarks.md"
LOG = ROOT / "docs" / "benchmarks-log.md"
COLUMNS = ["benchmark", "target", "figure", "reference", "runs", "date", "verdict", "section"]
VERDICTS = {"met", "missed", "information"}
MAIN_JOB = "train"


def verdict_rows() -> list[dict[str, str]]:
    """The rows of the table under "## Current verdicts"."""
    text = REFERENCE.read_text().split("## Current verdicts", 1)[1]
    lines = [line for line in text.split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == COLUMNS, f"the verdict table's columns are {COLUMNS}"
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        assert len(cells) == len(COLUMNS), f"a row of {len(cells)} cells: {line}"
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


def log_sections() -> dict[str, str]:
    """Each heading of the log (``##`` and ``###``, as written) → its text up to the next heading."""
    sections: dict[str, str] = {}
    heading, body = None, []
    for line in LOG.read_text().splitlines():
        found = re.match(r"#{2,3} (.*)", line)
        if found:
            if heading is not None:
                sections[heading] = "\n".join(body)
            heading, body = found.group(1).strip(), []
        else:
            body.append(line)
    if heading is not None:
        sections[heading] = "\n".join(body)
    return sections


def _unquoted(cell: str) -> str:
    """A cell as the log prints it: the table escapes a pipe, nothing else."""
    return cell.replace("\\|", "|")


def test_every_row_points_at_a_log_section_that_prints_its_figure_and_date() -> None:
    rows, sections = verdict_rows(), log_sections()
    assert len(rows) >= 20
    problems = []
    for row in rows:
        where = f"{row['benchmark']}: {row['target']}"
        section = _unquoted(row["section"])
        if section not in sections:
            problems.append(f"{where}: no section {section!r} in docs/benchmarks-log.md")
            continue
        text = section + "\n" + sections[section]
        if _unquoted(row["figure"]) not in text:
            problems.append(f"{where}: its section does not print {row['figure']!r}")
        if row["date"] != "—" and row["date"] not in text and row["date"] not in _dates_above(section):
            problems.append(f"{where}: its section is not dated {row['date']}")
        if row["verdict"] not in VERDICTS:
            problems.append(f"{where}: verdict {row['verdict']!r} is none of {sorted(VERDICTS)}")
    assert not problems, "docs/benchmarks.md's verdict table does not match the log:\n" + "\n".join(problems)


def _dates_above(section: str) -> str:
    """The ``##`` heading a ``###`` section sits under, and its text (where a run's date is often said)."""
    text = LOG.read_text()
    at = text.find(f"### {section}")
    above = text.rfind("\n## ", 0, at) if at >= 0 else -1
    return text[above:at] if above >= 0 else ""


def test_every_benchmark_with_a_command_line_has_a_row() -> None:
    named = {row["benchmark"].strip("`") for row in verdict_rows()}
    known = set(benchmarks()) | {MAIN_JOB}
    assert named <= known, f"rows for no benchmark: {sorted(named - known)}"
    missing = sorted(set(benchmarks()) - named)
    assert not missing, f"benchmarks with no row in docs/benchmarks.md's verdict table: {missing}"
