"""The README's install lines, as a user types them, install this project and not the package
index's ``gradientmail`` (another code base with another API)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import gradientmail

ROOT = Path(__file__).resolve().parent.parent
INSTALL = re.compile(r"`(pip install [^`]+)`")


def install_lines() -> list[str]:
    """Every ``pip install …`` the README's install paragraph gives."""
    paragraph = next(p for p in (ROOT / "README.md").read_text().split("\n\n") if p.startswith("Install"))
    return INSTALL.findall(paragraph)


def test_the_readme_gives_an_install_line_for_each_platform():
    lines = install_lines()
    assert len(lines) == 3, lines
    assert any("constraints.txt" in line for line in lines) and any("mlx" in line for line in lines)


def test_every_install_line_resolves_to_this_checkout():
    for line in install_lines():
        words = shlex.split(line)
        requirements = [w for w in words[2:] if not w.startswith("-") and not w.endswith(".txt")]
        assert requirements and all(r.startswith(".[") for r in requirements), f"{line!r} names a package, not this checkout"
        # what pip would install, without installing or fetching the dependencies
        report = subprocess.run(
            [sys.executable, "-m", *words, "--dry-run", "--no-deps", "--quiet", "--report", "-"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
        ).stdout  # fmt: skip
        (installed,) = json.loads(report)["install"]
        assert installed["metadata"]["name"] == "gradientmail"
        assert installed["metadata"]["version"] == gradientmail.__version__
        assert installed["download_info"]["url"] == ROOT.as_uri(), line
