"""The checked strings every request shares: names, device ids, datasets, ``init_from``.

Strings that end up in the database are checked to be printable UTF-8, so a
client cannot store something a later read would choke on. Errors read
``{"detail": "<field>: <what is allowed>"}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from scheduler.models.presets import PRESETS
from scheduler.planning import planner


def allowed_strategies() -> tuple[str, ...]:
    """Strategies the scheduler offers, ``auto`` first."""
    return tuple(planner.STRATEGIES)


def _printable(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 text") from None
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("must not contain control characters")
    return value


@dataclass(frozen=True, slots=True)
class _Matches:
    """The whole string matches ``pattern``, else ``message``: the check, and the pattern the
    schema shows, from one value."""

    pattern: str
    message: str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), "pattern": self.pattern}

    def _check(self, value: str) -> str:
        if not re.fullmatch(self.pattern, value):
            raise ValueError(self.message)
        return value


def _strategy(value: str) -> str:
    allowed = allowed_strategies()
    if value not in allowed:
        raise ValueError(f"must be one of {', '.join(allowed)}")
    return value


PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
"""What :func:`_printable` allows, for the OpenAPI document (pydantic checks with it)."""
_printable_schema = Field(json_schema_extra={"pattern": PRINTABLE})
Text = Annotated[str, _printable_schema, AfterValidator(_printable)]
Name = Annotated[
    str, Field(min_length=1, max_length=100), _printable_schema, AfterValidator(_printable)
]
DeviceId = Annotated[
    str, Field(min_length=1, max_length=200), _printable_schema, AfterValidator(_printable)
]


def _device_list(value: list[str]) -> list[str]:
    if not value:
        raise ValueError("must list at least one device id, or be omitted for all")
    if len(set(value)) != len(value):
        raise ValueError("lists a device twice")
    return value


DeviceIds = Annotated[
    list[DeviceId],
    Field(max_length=4096, json_schema_extra={"minItems": 1, "uniqueItems": True}),
    AfterValidator(_device_list),
]
"""Device ids, each once; omit the field (not ``[]``) for the whole cluster."""
PresetName = Annotated[
    str,
    Field(
        max_length=255,
        json_schema_extra={"enum": list(PRESETS)},
        description=f"A model preset: {', '.join(PRESETS)}.",
    ),
    AfterValidator(_printable),
]
"""A preset name, or (not in the schema's enum, for operators) a Hugging Face config in
the data directory, ``hf:DIR``: at most 255 printable characters, so no reference reaches
the file system with a NUL byte or a name longer than one directory entry may be."""
# A relative path whose segments do not start with '.': never absolute, never '..'.
_SEGMENT = r"[^/.\x00-\x1f\x7f][^/\x00-\x1f\x7f]*"
_RELATIVE = rf"{_SEGMENT}(/{_SEGMENT})*"
_Reference = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_printable)]
"""Something in the data directory or the store: 1 to 255 printable characters."""
DatasetName = Annotated[
    _Reference,
    _Matches(
        rf"^{_RELATIVE}$",
        "must be 'default' or a file name inside the server's data directory "
        "(relative, no segment starting with '.')",
    ),
]
InitFrom = Annotated[
    _Reference,
    _Matches(
        rf"^([0-9a-f]{{1,32}}(@[0-9]{{1,9}})?|hf:{_RELATIVE})$",
        "must be a job id ('JOB_ID' or 'JOB_ID@STEP') or 'hf:DIR', a Hugging Face "
        "model directory inside the server's data directory (relative, no segment "
        "starting with '.')",
    ),
]
StrategyName = Annotated[
    str,
    Field(json_schema_extra={"enum": list(allowed_strategies())}),
    AfterValidator(_strategy),
]


class RequestModel(BaseModel):
    """Request bodies: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid")
