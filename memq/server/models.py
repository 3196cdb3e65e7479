"""Response bodies of the HTTP API. Facts and history entries are the storage's own models, so
the API shows exactly what memq stores (one schema, not a copy)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from memq.core.settings import MemqSettings
from producer.producer import OfferStatus
from storage.base import Change
from storage.document import Fact, SupersededFact
from storage.provenance import FactExplanation, FactStatus
from storage.sources import Source


def setting_bounds(name: str) -> dict[str, Any]:
    """The ``ge``/``le``/``gt``/``lt`` of a setting, for a request field that overrides it per
    call (the per-call token budget is held to the limits of the setting it overrides)."""
    bounds: dict[str, Any] = {}
    for constraint in MemqSettings.model_fields[name].metadata:
        for kind in ("ge", "le", "gt", "lt"):
            if hasattr(constraint, kind):
                bounds[kind] = getattr(constraint, kind)
    return bounds


TOKEN_BUDGET = setting_bounds("injected_memory_max_tokens")


class HandOffAccepted(BaseModel):
    status: OfferStatus = Field(
        description="`queued`: Redis took it; `spooled`: Redis is unreachable, the server keeps "
        "it and sends it when Redis is back; `nothing_to_remember`: no user message with an "
        "answer in it"
    )
    context_id: str | None = None
    version: int | None = None
    deadline_ms: int | None = Field(default=None, description="when it is due, epoch ms")


class ContextBlock(BaseModel):
    block: str = Field(description="`<user_memory>…</user_memory>`, or empty")


_NEXT = "where the next page starts (pass it as `cursor`); null on the last page"


class FactsOut(BaseModel):
    facts: list[Fact]
    next_cursor: str | None = Field(default=None, description=_NEXT)


class HistoryOut(BaseModel):
    changes: list[Change]
    next_cursor: str | None = Field(default=None, description=_NEXT)


class FactWhy(BaseModel):
    """`memq why`: where a fact came from and what became of it."""

    fact_id: str
    status: FactStatus = Field(
        description="`gone`: neither current nor superseded; only the history remembers it"
    )
    fact: Fact | None
    sources: list[Source] = Field(description="oldest first; run-level for older documents")
    confirmations: int
    superseded: SupersededFact | None = Field(description="this fact's own entry, if superseded")
    supersedes: list[SupersededFact] = Field(description="the facts it replaced")
    history: list[Change] = Field(
        description="every entry about it or what it replaced, oldest first"
    )

    @classmethod
    def of(cls, explanation: FactExplanation) -> FactWhy:
        return cls(
            fact_id=explanation.fact_id,
            status=explanation.status,
            fact=explanation.fact,
            sources=explanation.sources,
            confirmations=explanation.confirmations,
            superseded=explanation.superseded,
            supersedes=explanation.supersedes,
            history=explanation.history,
        )


class SupersededOut(BaseModel):
    superseded: list[SupersededFact] = Field(description="newest first; never injected")
    next_cursor: str | None = Field(default=None, description=_NEXT)
