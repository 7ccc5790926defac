"""Frozen, validated configuration objects whose errors name the field that is wrong."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from gradientmail.errors import InvalidConfig

ConfigT = TypeVar("ConfigT", bound="FrozenConfig")


def invalid_config(error: ValidationError, prefix: str = "") -> InvalidConfig:
    """One ``InvalidConfig`` naming the first failing field and listing every problem."""
    problems = []
    first_field = prefix.rstrip(".") or "config"
    for index, item in enumerate(error.errors()):
        location = ".".join(str(part) for part in item["loc"] if not str(part).startswith("function-"))
        field = f"{prefix}{location}" if location else first_field
        if index == 0:
            first_field = field
        problems.append(f"{field}: {item['msg']} (got {item.get('input')!r})")
    message = "; ".join(problems)
    error_out = InvalidConfig(first_field, message)
    error_out.args = (message,)
    return error_out


class FrozenConfig(BaseModel):
    """Base for configuration: immutable, unknown fields refused, errors as ``InvalidConfig``."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise invalid_config(error) from None

    @classmethod
    def from_manifest(cls: type[ConfigT], form: Mapping[str, Any]) -> ConfigT:
        """Rebuild from the JSON form stored in a run manifest."""
        if not isinstance(form, Mapping):
            raise InvalidConfig(cls.__name__, f"expected a JSON object, got {type(form).__name__}")
        return cls(**dict(form))

    def to_manifest(self) -> dict[str, Any]:
        """The JSON form stored in a run manifest."""
        return self.model_dump(mode="json")
