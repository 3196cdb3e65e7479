"""The update a model proposes for one memory document, once its answer has been read and
normalised (``prompts.answer`` reads it out of the model's text): section summaries, new facts,
removals, stale removals and merges. Section keys are ours (``work_context``, …).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from storage.document import DEFAULT_CATEGORY


class SectionUpdate(BaseModel):
    model_config = ConfigDict(frozen=True)

    summary: str
    should_update: bool


class NewFact(BaseModel):
    model_config = ConfigDict(frozen=True)

    content: str = Field(min_length=1)
    category: str = DEFAULT_CATEGORY
    confidence: float = Field(ge=0.0, le=1.0)
    source_error: str | None = None


class StaleRemoval(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    reason: str = ""


class ConsolidationProposal(BaseModel):
    model_config = ConfigDict(frozen=True)

    source_ids: tuple[str, ...]
    content: str
    category: str | None = None
    confidence: float | None = None  # None: the merged fact takes its best source's confidence


class UpdateAnswer(BaseModel):
    """A parsed, normalised answer; section keys are ours (``work_context``, …)."""

    model_config = ConfigDict(frozen=True)

    sections: dict[str, SectionUpdate] = Field(default_factory=dict)
    new_facts: tuple[NewFact, ...] = ()
    facts_to_remove: tuple[str, ...] = ()
    stale_facts_to_remove: tuple[StaleRemoval, ...] = ()
    facts_to_consolidate: tuple[ConsolidationProposal, ...] = ()
    dropped_facts: int = 0

    def is_noop(self) -> bool:
        return not (
            any(s.should_update and s.summary for s in self.sections.values())
            or self.new_facts
            or self.facts_to_remove
            or self.stale_facts_to_remove
            or self.facts_to_consolidate
        )
