"""The memory document of one (user, agent): memq's `memory.json`.

memq writes snake_case (``created_at``, ``source_thread_id``, …) and reads DeerFlow's camelCase
files as they are: every field accepts its DeerFlow spelling, DeerFlow's ``source`` (a thread id,
``manual``, ``consolidation`` or ``unknown``) is split into ``source`` + ``source_thread_id``, and
sloppy values (``null`` confidence or category, ``null`` or non-object sections and groups, id-less
or over-long ids, blank contents) are repaired or dropped instead of failing the whole file: one bad
value must never turn a user's whole memory into a "corrupt" file.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from storage.sections import (
    HISTORY_SECTIONS,
    USER_SECTIONS,
    HistoryContext,
    UserContext,
)
from storage.sources import Source, repaired_source
from storage.vectors import VectorSet, readable_sets

# The category names are defined with the rest of the vocabulary and re-exported here, where
# most code looks for them.
from storage.vocabulary import (
    DEFAULT_CATEGORY,
    normalise_category,
    parse_confidence,
    parse_event_date,
    parse_timestamp,
)

log = logging.getLogger(__name__)

SCHEMA_VERSION = "memq/1"
FactSource = Literal["conversation", "manual", "consolidation", "import"]
FACT_SOURCES = ("conversation", "manual", "consolidation", "import")
MAX_FACT_ID_LENGTH = 128


def utc_now() -> datetime:
    return datetime.now(UTC)


def new_fact_id() -> str:
    return f"fact_{uuid.uuid4().hex[:8]}"


def _readable(model: type[BaseModel], value: Any) -> list[Any]:
    """The items of a list that validate as ``model`` (validated), the others dropped."""
    readable: list[Any] = []
    for item in value if isinstance(value, list) else []:
        try:
            readable.append(item if isinstance(item, model) else model.model_validate(item))
        except ValidationError:
            continue
    return readable


class Fact(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", validate_assignment=True)

    id: str = Field(default_factory=new_fact_id, min_length=1, max_length=MAX_FACT_ID_LENGTH)
    content: str = Field(min_length=1)
    category: str = DEFAULT_CATEGORY
    confidence: float = Field(default=0.5, ge=0.0, le=1.0)
    created_at: datetime | None = Field(
        default_factory=utc_now, validation_alias=AliasChoices("created_at", "createdAt")
    )
    source: FactSource = "conversation"
    source_thread_id: str | None = None
    source_error: str | None = Field(
        default=None, validation_alias=AliasChoices("source_error", "sourceError")
    )
    consolidated_at: datetime | None = Field(
        default=None, validation_alias=AliasChoices("consolidated_at", "consolidatedAt")
    )
    consolidated_from: list[str] = Field(
        default_factory=list, validation_alias=AliasChoices("consolidated_from", "consolidatedFrom")
    )
    # Where it was learnt, newest last and bounded; empty in documents written before sources
    # existed (see ``provenance``). Confirmations: times it was learnt again after the first.
    sources: list[Source] = Field(default_factory=list)
    confirmations: int = Field(default=0, ge=0)
    # When the user said it (the messages it was first learnt from), apart from ``created_at``,
    # when memq learnt it; and the day (or month, or year) the event it tells of happened, when
    # the model gave one. Both None in documents written before memq knew time.
    said_at: datetime | None = Field(
        default=None, validation_alias=AliasChoices("said_at", "saidAt")
    )
    event_date: str | None = Field(
        default=None, validation_alias=AliasChoices("event_date", "eventDate")
    )

    @model_validator(mode="before")
    @classmethod
    def _from_deerflow(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "source_thread_id" in data:
            return data
        source = data.get("source")
        if source is None or source in FACT_SOURCES:
            return data
        data = dict(data)
        data["source"] = "conversation"
        data["source_thread_id"] = None if source in ("", "unknown") else str(source)
        return data

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, value: Any) -> str:
        """Blank, non-text or over-long ids get a fresh id (truncating could collide)."""
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and 0 < len(value.strip()) <= MAX_FACT_ID_LENGTH:
            return value.strip()
        return new_fact_id()

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> Any:
        return value.strip() if isinstance(value, str) else value

    @field_validator("category", mode="before")
    @classmethod
    def _category(cls, value: Any) -> str:
        return normalise_category(value)

    @field_validator("confidence", mode="before")
    @classmethod
    def _confidence(cls, value: Any) -> float:
        """A stored confidence that cannot be read is the neutral 0.5, never a lost fact."""
        number = parse_confidence(value)
        return 0.5 if number is None else number

    @field_validator("created_at", "consolidated_at", "said_at", mode="before")
    @classmethod
    def _timestamps(cls, value: Any) -> datetime | None:
        return parse_timestamp(value)

    @field_validator("event_date", mode="before")
    @classmethod
    def _event_date(cls, value: Any) -> str | None:
        return parse_event_date(value)

    @field_validator("source", mode="before")
    @classmethod
    def _source(cls, value: Any) -> str:
        return value if value in FACT_SOURCES else "conversation"

    @field_validator("source_thread_id", mode="before")
    @classmethod
    def _source_thread_id(cls, value: Any) -> str | None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        return value.strip() if isinstance(value, str) and value.strip() else None

    @field_validator("source_error", mode="before")
    @classmethod
    def _source_error(cls, value: Any) -> str | None:
        return value.strip() if isinstance(value, str) and value.strip() else None

    @field_validator("consolidated_from", mode="before")
    @classmethod
    def _consolidated_from(cls, value: Any) -> list[str]:
        if not isinstance(value, list):
            return []
        return [item for item in value if isinstance(item, str) and item]

    @field_validator("sources", mode="wrap")
    @classmethod
    def _sources(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> list[Source]:
        """Unreadable sources are dropped, never the fact (a list memq wrote is the fast path)."""
        try:
            return handler(value)  # type: ignore[no-any-return]
        except ValidationError:
            readable = []
            for item in value if isinstance(value, list) else []:
                try:
                    readable.append(repaired_source(item))
                except (ValueError, ValidationError):
                    continue
            return readable

    @field_validator("confirmations", mode="before")
    @classmethod
    def _confirmations(cls, value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    def when_said(self) -> datetime | None:
        """When the user said it, or — for a fact from before memq knew that — when memq learnt
        it: what time windows, staleness and "newest first" go by."""
        return self.said_at if self.said_at is not None else self.created_at

    def provenance(self) -> list[Source]:
        """The fact's sources; a fact learnt before sources were kept reads as run-level
        attribution from its source thread (nothing, when that is unknown too)."""
        if self.sources:
            return list(self.sources)
        if self.source == "conversation" and self.source_thread_id is not None:
            return [Source(thread_id=self.source_thread_id)]
        return []


def said_within(
    facts: Iterable[Fact], since: datetime | None = None, until: datetime | None = None
) -> list[Fact]:
    """The facts said within ``[since, until]`` (either end open when None), by
    :meth:`Fact.when_said`; with a window, a fact that knows no time at all is outside it."""
    if since is None and until is None:
        return list(facts)
    low, high = _aware(since), _aware(until)
    return [
        f
        for f in facts
        if (said := f.when_said()) is not None
        and (low is None or said >= low)
        and (high is None or said <= high)
    ]


def _aware(moment: datetime | None) -> datetime | None:
    return moment if moment is None or moment.tzinfo else moment.replace(tzinfo=UTC)


SupersededKind = Literal["contradicted", "stale"]


class SupersededFact(BaseModel):
    """A fact that stopped being valid: kept (bounded) for ``why``, export and history, never
    injected and never shown to the model."""

    model_config = ConfigDict(extra="ignore")

    fact: Fact
    kind: SupersededKind = "contradicted"
    superseded_at: datetime | None = None
    replaced_by: list[str] = Field(default_factory=list)  # ids of the facts that replaced it
    reason: str = ""
    thread_id: str | None = None  # the thread whose extraction superseded it

    @field_validator("superseded_at", mode="before")
    @classmethod
    def _superseded_at(cls, value: Any) -> datetime | None:
        return parse_timestamp(value)

    @field_validator("kind", mode="before")
    @classmethod
    def _kind(cls, value: Any) -> str:
        return "stale" if value == "stale" else "contradicted"

    @field_validator("replaced_by", mode="before")
    @classmethod
    def _replaced_by(cls, value: Any) -> list[str]:
        if not isinstance(value, list):
            return []
        return [item for item in value if isinstance(item, str) and item]


class MemoryDocument(BaseModel):
    """One user's memory for one agent (or the user-global memory when the agent is None)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    version: str = SCHEMA_VERSION
    last_updated: datetime | None = Field(
        default=None, validation_alias=AliasChoices("last_updated", "lastUpdated")
    )
    user: UserContext = Field(default_factory=UserContext)
    history: HistoryContext = Field(default_factory=HistoryContext)
    facts: list[Fact] = Field(default_factory=list)
    # Contradicted and stale facts, oldest first and bounded (``superseded_max_facts``).
    superseded: list[SupersededFact] = Field(default_factory=list)
    # Embedding model name → the vectors of the facts' texts (storage/vectors.py); pruned to the
    # current facts on every save, absent until an embedding model is configured.
    embeddings: dict[str, VectorSet] = Field(default_factory=dict)

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> str:
        # DeerFlow files say "1.0"; once read they are memq documents.
        return SCHEMA_VERSION

    @field_validator("last_updated", mode="before")
    @classmethod
    def _last_updated(cls, value: Any) -> datetime | None:
        return parse_timestamp(value)

    @field_validator("facts", mode="before")
    @classmethod
    def _drop_unusable_facts(cls, value: Any) -> list[Any]:
        """A fact without usable content — or one that still fails after every repair — is
        dropped, never the whole document."""
        if not isinstance(value, list):
            return []
        facts: list[Any] = []
        for item in value:
            if isinstance(item, Fact):
                facts.append(item)
            elif (
                isinstance(item, dict)
                and isinstance(item.get("content"), str)
                and item["content"].strip()
            ):
                try:
                    facts.append(Fact.model_validate(item))
                except ValidationError as exc:
                    log.warning("dropping an unreadable memory fact %.80r: %s", item, exc)
        return facts

    @field_validator("embeddings", mode="before")
    @classmethod
    def _readable_embeddings(cls, value: Any) -> dict[str, VectorSet]:
        return readable_sets(value)

    @field_validator("superseded", mode="wrap")
    @classmethod
    def _readable_superseded(
        cls, value: Any, handler: ValidatorFunctionWrapHandler
    ) -> list[SupersededFact]:
        try:
            return handler(value)  # type: ignore[no-any-return]
        except ValidationError:
            log.warning("dropping unreadable superseded facts")
            return handler(_readable(SupersededFact, value))  # type: ignore[no-any-return]

    def is_empty(self) -> bool:
        sections = [getattr(self.user, n) for n in USER_SECTIONS] + [
            getattr(self.history, n) for n in HISTORY_SECTIONS
        ]
        return not self.facts and not any(s.summary.strip() for s in sections)

    def fact(self, fact_id: str) -> Fact | None:
        return next((f for f in self.facts if f.id == fact_id), None)

    def superseded_fact(self, fact_id: str) -> SupersededFact | None:
        return next((s for s in reversed(self.superseded) if s.fact.id == fact_id), None)

    def to_json(self, *, vectors: bool = False) -> dict[str, Any]:
        """The memory.json shape. The fact vectors only with ``vectors`` (export and the stored
        file): what an agent, a tool or a page reads is the memory, not kilobytes of base64."""
        return self.model_dump(mode="json", exclude=None if vectors else {"embeddings"})


def empty_document() -> MemoryDocument:
    return MemoryDocument()


_Model = TypeVar("_Model", bound=BaseModel)


def copy_document(document: MemoryDocument) -> MemoryDocument:
    """A private copy that shares nothing mutable with ``document``.

    Every leaf of a document is immutable (str, float, datetime) except the lists, so copying the
    models and the lists is enough — about 4x cheaper than ``model_copy(deep=True)``, which runs
    ``copy.deepcopy`` over every string on every load, apply and save of the pipeline.
    """
    user = _copied(document.user, {n: _copied(getattr(document.user, n)) for n in USER_SECTIONS})
    history = _copied(
        document.history, {n: _copied(getattr(document.history, n)) for n in HISTORY_SECTIONS}
    )
    facts = [
        _copied(f, {"consolidated_from": list(f.consolidated_from), "sources": list(f.sources)})
        for f in document.facts
    ]
    # Superseded entries are replaced, never changed in place: copying the list is enough.
    return _copied(
        document,
        {
            "user": user,
            "history": history,
            "facts": facts,
            "superseded": list(document.superseded),
            # Vector sets are replaced, never changed in place (storage/vectors.py).
            "embeddings": dict(document.embeddings),
        },
    )


_set_attribute = object.__setattr__


def _copied(model: _Model, changed: dict[str, Any] | None = None) -> _Model:
    """A shallow copy of ``model`` with ``changed`` fields replaced: what ``model_copy(update=)``
    does — the same four attributes pydantic's own ``__copy__`` sets — without its generic steps,
    at under half the cost; a document copy is one of these per fact, several times per
    extraction. A model with extra fields or private attributes takes pydantic's own path."""
    if model.__pydantic_extra__ is not None or model.__pydantic_private__ is not None:
        return model.model_copy(update=changed)
    new = type(model).__new__(type(model))
    values = model.__dict__.copy()
    fields_set = model.__pydantic_fields_set__.copy()
    if changed:
        values.update(changed)
        fields_set.update(changed)
    _set_attribute(new, "__dict__", values)
    _set_attribute(new, "__pydantic_fields_set__", fields_set)
    _set_attribute(new, "__pydantic_extra__", None)
    _set_attribute(new, "__pydantic_private__", None)
    return new
