"""The six summary sections of a memory document, in two groups (``user`` and ``history``).

Every section accepts DeerFlow's camelCase spelling and sloppy values (``null``, a bare string, a
non-object group) are repaired, so one bad value never costs a whole document.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from storage.vocabulary import parse_timestamp

USER_SECTIONS = ("work_context", "personal_context", "top_of_mind")
HISTORY_SECTIONS = ("recent_months", "earlier_context", "long_term_background")
# Our section names and DeerFlow's camelCase spelling, which its files and the model's answer use.
SECTION_KEYS: dict[str, str] = {
    "work_context": "workContext",
    "personal_context": "personalContext",
    "top_of_mind": "topOfMind",
    "recent_months": "recentMonths",
    "earlier_context": "earlierContext",
    "long_term_background": "longTermBackground",
}


def _object_or_empty(data: Any) -> Any:
    """A group or section that is ``null`` or not an object reads as an empty one."""
    return data if isinstance(data, dict | BaseModel) else {}


class Section(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", validate_assignment=True)

    summary: str = ""
    updated_at: datetime | None = Field(
        default=None, validation_alias=AliasChoices("updated_at", "updatedAt")
    )

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


class UserContext(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _sloppy(cls, data: Any) -> Any:
        return _object_or_empty(data)

    work_context: Section = Field(
        default_factory=Section, validation_alias=AliasChoices("work_context", "workContext")
    )
    personal_context: Section = Field(
        default_factory=Section,
        validation_alias=AliasChoices("personal_context", "personalContext"),
    )
    top_of_mind: Section = Field(
        default_factory=Section, validation_alias=AliasChoices("top_of_mind", "topOfMind")
    )


class HistoryContext(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _sloppy(cls, data: Any) -> Any:
        return _object_or_empty(data)

    recent_months: Section = Field(
        default_factory=Section, validation_alias=AliasChoices("recent_months", "recentMonths")
    )
    earlier_context: Section = Field(
        default_factory=Section,
        validation_alias=AliasChoices("earlier_context", "earlierContext"),
    )
    long_term_background: Section = Field(
        default_factory=Section,
        validation_alias=AliasChoices("long_term_background", "longTermBackground"),
    )
