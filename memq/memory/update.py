"""The answer the update model gives, as one set of Pydantic models: the single description of
that answer. The prompt's schema block is rendered from it (``prompts.answer``), the model's JSON
is validated by it, and the offline extractor and the scripted test server write their answers
with it. Field names are ours (snake_case); each field's wire name is its camelCase alias, the
spelling of DeerFlow's prompt, and both spellings are accepted.

Validation is tolerant field by field, because one sloppy value must not cost the whole answer:
a section that is not an object, a removal id that is not text, a review item without an id are
skipped; a new fact that is unusable is dropped and counted (``dropped_facts``). The caller
rejects the whole answer when it removes facts and also dropped a new one (a replacement must
never degrade into a deletion).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import (
    AliasGenerator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from storage.sections import HISTORY_SECTIONS, SECTION_KEYS, USER_SECTIONS, either_spelling
from storage.vocabulary import (
    CATEGORIES,
    DEFAULT_CATEGORY,
    known_category,
    parse_confidence,
    parse_event_date,
)

_TRUE_STRINGS = {"true", "yes", "1"}
_MAX_CITES = 32  # labels read per fact: a fact cannot come from more messages than a prompt holds
_T = TypeVar("_T", bound=BaseModel)


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _required_text(value: Any) -> str:
    text = _text(value)
    if text is None:
        raise ValueError("non-blank text is required")
    return text


def _flag(value: Any) -> bool:
    # DeerFlow tested truthiness, so the string "false" meant "update".
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().casefold() in _TRUE_STRINGS
    if isinstance(value, int | float):
        return value == 1
    return False


def _valid_items(model: type[_T], value: Any) -> tuple[list[_T], int]:
    """The items of ``value`` (a list) that validate as ``model``, and how many did not."""
    if not isinstance(value, list):
        return [], 0
    kept: list[_T] = []
    dropped = 0
    for item in value:
        try:
            kept.append(model.model_validate(item))
        except ValidationError:
            dropped += 1
    return kept, dropped


class _Answer(BaseModel):
    # Every field reads under its own name or its camelCase wire name, and writes the wire name.
    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        alias_generator=AliasGenerator(
            validation_alias=either_spelling, serialization_alias=to_camel
        ),
    )


class SectionUpdate(_Answer):
    summary: str
    should_update: bool = False

    @field_validator("summary", mode="before")
    @classmethod
    def _summary(cls, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError("a summary is text")
        return value.strip()

    @field_validator("should_update", mode="before")
    @classmethod
    def _should_update(cls, value: Any) -> bool:
        return _flag(value)


class NewFact(_Answer):
    content: str = Field(min_length=1)
    # The schema names the categories (a constrained decoder then writes one of them); the
    # validator still reads anything, unknown names as the default.
    category: str = Field(default=DEFAULT_CATEGORY, json_schema_extra={"enum": list(CATEGORIES)})
    # Absent means "inferred" (0.5); an explicit null, a bool or text that is no number is
    # malformed and drops the fact.
    confidence: float = Field(default=0.5, ge=0.0, le=1.0)
    source_error: str | None = None
    # Labels of the new messages the fact comes from (``m1``…); empty or wrong labels make the
    # fact's source the whole run.
    cites: tuple[str, ...] = ()
    # The day (``YYYY-MM-DD``; ``YYYY-MM`` or ``YYYY`` when only that is known) the event the fact
    # tells of happened or will happen; unreadable → None, never a dropped fact.
    event_date: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> str:
        return _required_text(value)

    @field_validator("category", mode="before")
    @classmethod
    def _category(cls, value: Any) -> str:
        return known_category(value) or DEFAULT_CATEGORY

    @field_validator("confidence", mode="before")
    @classmethod
    def _confidence(cls, value: Any) -> float:
        number = parse_confidence(value)
        if number is None:
            raise ValueError("a confidence is a finite number")
        return number

    @field_validator("source_error", mode="before")
    @classmethod
    def _source_error(cls, value: Any) -> str | None:
        return _text(value)

    @field_validator("event_date", mode="before")
    @classmethod
    def _event_date(cls, value: Any) -> str | None:
        return parse_event_date(value)

    @field_validator("cites", mode="before")
    @classmethod
    def _cites(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):  # one label where a list was asked for
            value = [value]
        if not isinstance(value, list | tuple):
            return ()
        labels = (_text(item) for item in value[:_MAX_CITES])
        return tuple(dict.fromkeys(label for label in labels if label is not None))


class StaleRemoval(_Answer):
    id: str
    reason: str = ""

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, value: Any) -> str:
        return _required_text(value)

    @field_validator("reason", mode="before")
    @classmethod
    def _reason(cls, value: Any) -> str:
        return value.strip() if isinstance(value, str) else ""


class MergedFact(_Answer):
    """What a consolidation proposes to store in place of its sources."""

    content: str
    category: str | None = None
    confidence: float | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> str:
        return _required_text(value)

    @field_validator("category", mode="before")
    @classmethod
    def _category(cls, value: Any) -> str | None:
        return known_category(value)

    @field_validator("confidence", mode="before")
    @classmethod
    def _confidence(cls, value: Any) -> float | None:
        return parse_confidence(value)


class ConsolidationProposal(_Answer):
    source_ids: tuple[str, ...]
    content: str
    category: str | None = None
    confidence: float | None = None  # None: the merged fact takes its best source's confidence

    @model_validator(mode="before")
    @classmethod
    def _from_wire(cls, data: Any) -> Any:
        """The wire nests the merged fact under ``consolidated``."""
        if isinstance(data, Mapping) and "consolidated" in data:
            merged = MergedFact.model_validate(data["consolidated"])
            alias = cls.model_fields["source_ids"].serialization_alias or "source_ids"
            return {
                **merged.model_dump(),
                "source_ids": data.get(alias, data.get("source_ids")),
            }
        return data

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The wire shape: the merged fact's fields nested under ``consolidated``."""
        json_schema = handler(core_schema)
        target = handler.resolve_ref_schema(json_schema)
        properties = target["properties"]
        ids = cls.model_fields["source_ids"].serialization_alias or "source_ids"
        merged = {name: value for name, value in properties.items() if name != ids}
        target["properties"] = {
            ids: properties[ids],
            "consolidated": {
                "type": "object",
                "properties": merged,
                "required": [name for name in target.get("required", []) if name in merged],
            },
        }
        target["required"] = [ids, "consolidated"]
        return json_schema

    @field_validator("source_ids", mode="before")
    @classmethod
    def _source_ids(cls, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list | tuple):
            raise ValueError("sourceIds is a list of fact ids")
        ids = tuple(dict.fromkeys(i.strip() for i in value if isinstance(i, str) and i.strip()))
        if len(ids) < 2:
            raise ValueError("a merge needs two distinct sources")
        return ids

    def to_wire(self) -> dict[str, Any]:
        merged = MergedFact.model_construct(
            content=self.content, category=self.category, confidence=self.confidence
        )
        alias = type(self).model_fields["source_ids"].serialization_alias or "source_ids"
        return {alias: list(self.source_ids), "consolidated": merged.model_dump(exclude_none=True)}


def _sections_from_wire(data: Mapping[str, Any]) -> dict[str, SectionUpdate]:
    sections: dict[str, SectionUpdate] = {}
    for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
        block = data.get(group)
        if not isinstance(block, Mapping):
            continue
        for name in names:
            raw = block.get(SECTION_KEYS[name], block.get(name))
            try:
                sections[name] = SectionUpdate.model_validate(raw)
            except ValidationError:
                continue
    return sections


def _removal_ids(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    ids: list[str] = []
    for item in value:
        # Bare ids (the schema we ask for) and DeerFlow HEAD's {"id": …} objects.
        text = _text(item.get("id") if isinstance(item, Mapping) else item)
        if text is not None and text not in ids:
            ids.append(text)
    return tuple(ids)


class UpdateAnswer(_Answer):
    """A validated answer; section keys are ours (``work_context``, …), grouped on the wire
    under ``user`` and ``history`` with their camelCase names."""

    # In the order a model writes them: the facts first (what a small model must not lose to
    # the summaries, and what a cut answer then keeps), the summaries, the review lists.
    new_facts: tuple[NewFact, ...] = ()
    facts_to_remove: tuple[str, ...] = ()
    sections: dict[str, SectionUpdate] = Field(default_factory=dict)
    stale_facts_to_remove: tuple[StaleRemoval, ...] = ()
    facts_to_consolidate: tuple[ConsolidationProposal, ...] = ()
    # New facts the answer held that did not validate, and the wire keys of the answer's
    # shape it left out (an absent list means "none"); neither is ever sent on the wire.
    dropped_facts: int = Field(default=0, exclude=True)
    missing_fields: tuple[str, ...] = Field(default=(), exclude=True)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The wire shape (what :meth:`to_wire` writes and :meth:`from_wire` reads): the
        sections grouped under ``user`` and ``history`` by their camelCase names, in their
        field's place."""
        json_schema = handler(core_schema)
        target = handler.resolve_ref_schema(json_schema)
        properties: dict[str, Any] = {}
        for name, value in target["properties"].items():
            if name != "sections":
                properties[name] = value
                continue
            for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
                section = value["additionalProperties"]
                properties[group] = {
                    "type": "object",
                    "properties": {SECTION_KEYS[n]: section for n in names},
                }
        target["properties"] = properties
        target["required"] = list(REQUIRED_KEYS)
        return json_schema

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> UpdateAnswer:
        """Validate a decoded answer item by item; unusable new facts are counted, not fatal.
        An absent list means none (noted in ``missing_fields``); a ``newFacts`` that is there
        but not a list counts as one dropped fact."""
        raw_facts = _field(data, "new_facts")
        facts, dropped = _valid_items(NewFact, raw_facts)
        if raw_facts is not None and not isinstance(raw_facts, list):
            dropped = 1
        stale, _ = _valid_items(StaleRemoval, _field(data, "stale_facts_to_remove"))
        merges, _ = _valid_items(ConsolidationProposal, _field(data, "facts_to_consolidate"))
        return cls(
            sections=_sections_from_wire(data),
            new_facts=tuple(facts),
            facts_to_remove=_removal_ids(_field(data, "facts_to_remove")),
            stale_facts_to_remove=tuple(stale),
            facts_to_consolidate=tuple(merges),
            dropped_facts=dropped,
            missing_fields=tuple(key for key in EXPECTED_KEYS if _absent(data, key)),
        )

    def to_wire(self) -> dict[str, Any]:
        """The answer as a model writes it (camelCase, sections grouped)."""
        groups: dict[str, dict[str, Any]] = {"user": {}, "history": {}}
        for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
            for name in names:
                if name in self.sections:
                    section = self.sections[name].model_dump(by_alias=True)
                    groups[group][SECTION_KEYS[name]] = section
        return {
            _alias("new_facts"): [
                f.model_dump(mode="json", by_alias=True, exclude_none=True) for f in self.new_facts
            ],
            _alias("facts_to_remove"): list(self.facts_to_remove),
            **groups,
            _alias("stale_facts_to_remove"): [s.model_dump() for s in self.stale_facts_to_remove],
            _alias("facts_to_consolidate"): [c.to_wire() for c in self.facts_to_consolidate],
        }

    def is_noop(self) -> bool:
        return not (
            any(s.should_update and s.summary for s in self.sections.values())
            or self.new_facts
            or self.facts_to_remove
            or self.stale_facts_to_remove
            or self.facts_to_consolidate
        )


def _alias(field: str) -> str:
    """The wire name of one of :class:`UpdateAnswer`'s fields."""
    return UpdateAnswer.model_fields[field].serialization_alias or field


def _field(data: Mapping[str, Any], field: str) -> Any:
    """A field of a decoded answer, under its wire name or ours."""
    return data.get(_alias(field), data.get(field))


def _absent(data: Mapping[str, Any], key: str) -> bool:
    """``key`` (a wire name) is in neither spelling in ``data``."""
    return key not in data and _OURS.get(key, key) not in data


_OURS = {_alias(name): name for name in UpdateAnswer.model_fields}  # wire name -> ours
# The keys every complete answer has: an object with all of them is the answer, wherever it is.
REQUIRED_KEYS = ("user", "history", _alias("new_facts"))
# What every answer is asked to say (the review lists only when a review is asked for): an answer
# that leaves one out is read as "none" there, and counted.
EXPECTED_KEYS = (*REQUIRED_KEYS, _alias("facts_to_remove"))
# Every top-level key of an answer: an object holding none of them is not an answer.
ANSWER_KEYS = (
    "user",
    "history",
    *(
        _alias(name)
        for name, info in UpdateAnswer.model_fields.items()
        if name != "sections" and not info.exclude
    ),
)


def partial_answer(data: Mapping[str, Any]) -> bool:
    """``data`` is an answer that left keys out: it holds at least one key of an answer, and
    every one it holds is of the answer's kind (the groups objects, the rest lists), so that a
    stray ``{"user": "alice"}`` in prose is not taken for one."""
    held = [key for key in ANSWER_KEYS if not _absent(data, key)]
    for key in held:
        value = data[key] if key in data else data[_OURS.get(key, key)]
        if not isinstance(value, dict if key in ("user", "history") else list):
            return False
    return bool(held)
