"""The six summary sections of a memory document, in two groups (``user`` and ``history``).

Every section accepts DeerFlow's camelCase spelling and sloppy values (``null``, a bare string, a
non-object group) are repaired, so one bad value never costs a whole document.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import (
    AliasChoices,
    AliasGenerator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from storage.vocabulary import parse_timestamp

USER_SECTIONS = ("work_context", "personal_context", "top_of_mind")
HISTORY_SECTIONS = ("recent_months", "earlier_context", "long_term_background")
# Our section names and DeerFlow's camelCase spelling, which its files and the model's answer use.
SECTION_KEYS: dict[str, str] = {
    name: to_camel(name) for name in (*USER_SECTIONS, *HISTORY_SECTIONS)
}


def either_spelling(name: str) -> AliasChoices:
    """A field reads under its own name or DeerFlow's camelCase one (its files and the model's
    answers use it); memq writes its own names."""
    return AliasChoices(name, to_camel(name))


_EITHER_SPELLING = AliasGenerator(validation_alias=either_spelling)


def _object_or_empty(data: Any) -> Any:
    """A group or section that is ``null`` or not an object reads as an empty one."""
    return data if isinstance(data, dict | BaseModel) else {}


class Section(BaseModel):
    model_config = ConfigDict(
        alias_generator=_EITHER_SPELLING, extra="ignore", validate_assignment=True
    )

    summary: str = ""
    updated_at: datetime | None = None

    @model_validator(mode="before")
    @classmethod
    def _sloppy(cls, data: Any) -> Any:
        if isinstance(data, str):  # a bare summary where an object was expected
            return {"summary": data}
        return _object_or_empty(data)

    @field_validator("summary", mode="before")
    @classmethod
    def _summary(cls, value: Any) -> str:
        return "" if value is None else str(value)

    @field_validator("updated_at", mode="before")
    @classmethod
    def _updated_at(cls, value: Any) -> datetime | None:
        return parse_timestamp(value)


class _Group(BaseModel):
    """``user`` or ``history``: three sections; a group that is not an object reads as empty."""

    model_config = ConfigDict(alias_generator=_EITHER_SPELLING, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _sloppy(cls, data: Any) -> Any:
        return _object_or_empty(data)


class UserContext(_Group):
    work_context: Section = Field(default_factory=Section)
    personal_context: Section = Field(default_factory=Section)
    top_of_mind: Section = Field(default_factory=Section)


class HistoryContext(_Group):
    recent_months: Section = Field(default_factory=Section)
    earlier_context: Section = Field(default_factory=Section)
    long_term_background: Section = Field(default_factory=Section)
