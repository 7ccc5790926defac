"""The one policy for tests that need a system tool (promtool, podman, …) from Debian's packages.

The set-up installs those tools as root on Debian, so under CI a missing tool is a failure;
elsewhere (a developer's Mac, no apt) the test is skipped with the reason, so the rest of
the suite stays usable there.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def tool_missing(message: str) -> NoReturn:
    """Fail under CI, skip elsewhere, saying what is missing and how to get it."""
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI must have it: the set-up installs it)")
    pytest.skip(message)


def require_tool(name: str, package: str = "prometheus") -> str:
    """The tool's path, or :func:`tool_missing` naming the Debian package that provides it."""
    path = shutil.which(name)
    if path is None:
        tool_missing(f"{name} not found: scripts/bootstrap.sh installs it (Debian package {package!r})")
    return path
