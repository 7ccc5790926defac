"""Learner and node ids: the one check every layer applies, and the default a node takes.

An id becomes a path segment of the run's keys (``leases/learners/{id}.json``,
``…/{id}-{n}.json``), so it must never be able to name a path of its own.
"""

from __future__ import annotations

import os
import re
import socket

from gradientmail.errors import InvalidKey

__all__ = ["LEARNER_ID", "check_learner_id", "default_learner_id"]

LEARNER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_learner_id(value: object) -> str:
    """The id if it is 1–64 of letters, digits, ``._-`` starting with a letter or digit.

    Raises:
        InvalidKey: (a ``ValueError``) naming the id, so records, keys and settings reject
            path-like ids the same way.
    """
    if not isinstance(value, str) or not LEARNER_ID.match(value):
        raise InvalidKey(
            f"{value!r} is not a valid id: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def default_learner_id() -> str:
    """``GRADIENTMAIL_LEARNER_ID`` or the host name made id-safe: stable across restarts of a node."""
    configured = os.environ.get("GRADIENTMAIL_LEARNER_ID")
    if configured:
        return configured
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip(".-_") or "learner"
    return name[:64]
