"""Checks of the arguments users pass to the session's tools, each naming the field it refuses."""

from __future__ import annotations

from gradientmail.errors import InvalidConfig, InvalidKey
from gradientmail.records import check_learner_id

__all__ = ["checked_name", "positive_int"]


def checked_name(field: str, value: object) -> str:
    """``value`` if it is written like a learner id (it becomes part of mailbox keys), else
    ``InvalidConfig(field)`` saying so: how queues and barriers are named."""
    try:
        return check_learner_id(value)
    except InvalidKey as exc:
        raise InvalidConfig(field, f"a {field} name is written like a learner id: {exc}") from None


def positive_int(field: str, value: object) -> int:
    """``value`` if it is an int (not a bool) of at least 1, else ``InvalidConfig(field)``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidConfig(field, f"must be a positive integer, got {value!r}")
    return value
