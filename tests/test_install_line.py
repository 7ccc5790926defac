"""The README's install lines, as a user types them, install this project (the distribution
``gradientmail-diloco``) and not the package index's ``gradientmail`` (another code base with
another API); a wheel built from the checkout installs into a fresh virtual environment
(docs/install.md)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import gradientmail

ROOT = Path(__file__).resolve().parent.parent
INSTALL = re.compile(r"`(pip install [^`]+)`")
DISTRIBUTION = "gradientmail-diloco"


def install_lines() -> list[str]:
    """Every ``pip install …`` the README's install paragraph gives."""
    paragraph = next(p for p in (ROOT / "README.md").read_text().split("\n\n") if p.startswith("Install"))
    return INSTALL.findall(paragraph)


def test_the_readme_gives_an_install_line_for_each_platform():
    lines = install_lines()
    assert len(lines) == 3, lines
    assert any("constraints.txt" in line for line in lines) and any("mlx" in line for line in lines)


@pytest.mark.slow
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
        assert installed["metadata"]["name"] == DISTRIBUTION
        assert installed["metadata"]["version"] == gradientmail.__version__
        assert installed["download_info"]["url"] == ROOT.as_uri(), line


@pytest.mark.slow
def test_a_wheel_built_from_the_checkout_installs_into_a_fresh_environment(tmp_path):
    """docs/install.md's wheel: built without the network (the set-up's setuptools), installed
    into a new virtual environment with no other package, it carries the ``gradientmail`` import
    package at this version, the ``gradientmail`` command, the license and the extras."""
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet"]
    subprocess.run([*build, "-w", str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name == f"gradientmail_diloco-{gradientmail.__version__}-py3-none-any.whl"
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=120)
    python = fresh / "bin" / "python"
    # the running pip installs into the fresh environment (--python), without its dependencies
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    probe = """
import importlib.metadata as m, json, pathlib
d = m.distribution("gradientmail-diloco")
files = {str(f) for f in d.files}
print(json.dumps({
    "version": d.version,
    "package": "gradientmail/__init__.py" in files and "gradientmail/session/session.py" in files,
    "typed": "gradientmail/py.typed" in files,
    "license": any(f.endswith("LICENSE") for f in files),
    "command": [e.value for e in d.entry_points if e.name == "gradientmail"],
    "extras": sorted(d.metadata.get_all("Provides-Extra")),
    "requires": d.requires,
}))
"""
    found = json.loads(subprocess.run([str(python), "-c", probe], check=True, capture_output=True, text=True).stdout)
    assert found["version"] == gradientmail.__version__ and found["package"] and found["typed"] and found["license"]
    assert found["command"] == ["gradientmail.cli:main"], found["command"]
    assert {"torch", "mlx", "s3", "telemetry"} <= set(found["extras"])
    assert any(r.startswith("torch") and 'extra == "torch"' in r for r in found["requires"])
    assert (fresh / "bin" / "gradientmail").exists()
