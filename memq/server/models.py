"""Response bodies of the HTTP API. Facts and history entries are the storage's own models, so
the API shows exactly what memq stores (one schema, not a copy)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from memq.server.service import HandOffStatus
from storage.base import Change
from storage.document import Fact


class HandOffAccepted(BaseModel):
    status: HandOffStatus = Field(
        description="`queued`: Redis took it; `spooled`: Redis is unreachable, the server keeps "
        "it and sends it when Redis is back; `nothing_to_remember`: no user message with an "
        "answer in it"
    )
    context_id: str | None = None
    version: int | None = None
    deadline_ms: int | None = Field(default=None, description="when it is due, epoch ms")


class ContextBlock(BaseModel):
    block: str = Field(description="`<user_memory>…</user_memory>`, or empty")


class FactsOut(BaseModel):
    facts: list[Fact]


class HistoryOut(BaseModel):
    changes: list[Change]
