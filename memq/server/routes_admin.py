"""Management (scope ``admin``): facts by hand, export and import, forget a user or a thread.
Every write is the memory manager's (serialised with running extractions, recorded in the
history) or the erasure's, exactly as from the CLI."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from fastapi import Body, Query
from pydantic import BaseModel, ConfigDict, Field

from memq.operations.access import Principal
from memq.server.ids import ID
from memq.server.routing import AgentName, Service, caller, new_router
from storage.document import Fact
from storage.vocabulary import DEFAULT_CATEGORY

router = new_router()
USER = f"/v1/users/{{user_id:{ID}}}"  # one percent-encoded segment: memq/server/ids.py
_TAGS: list[str | Enum] = ["admin"]


class NewFact(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str = Field(min_length=1)
    agent_name: str | None = None
    category: str = DEFAULT_CATEGORY
    confidence: float = Field(default=0.9, ge=0.0, le=1.0)


@router.post(USER + "/facts", tags=_TAGS, status_code=201, response_model=Fact)
def add_fact(
    who: Annotated[Principal, caller("add_fact")], user_id: str, body: NewFact, svc: Service
) -> Fact:
    """Add a fact by hand, held to the same fact cap as an extraction (409 when the cap
    evicts the new fact itself)."""
    return svc.add_fact(
        who,
        user_id,
        body.agent_name,
        body.content,
        category=body.category,
        confidence=body.confidence,
    )


class FactEdit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_name: str | None = None
    content: str | None = Field(default=None, min_length=1)
    category: str | None = None
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)


@router.patch(USER + f"/facts/{{fact_id:{ID}}}", tags=_TAGS, response_model=Fact)
def edit_fact(
    who: Annotated[Principal, caller("edit_fact")],
    user_id: str,
    fact_id: str,
    body: FactEdit,
    svc: Service,
) -> Fact:
    """Change a fact's content, category or confidence (only the fields given)."""
    return svc.edit_fact(
        who,
        user_id,
        body.agent_name,
        fact_id,
        content=body.content,
        category=body.category,
        confidence=body.confidence,
    )


@router.delete(USER + f"/facts/{{fact_id:{ID}}}", tags=_TAGS, response_model=Fact)
def delete_fact(
    who: Annotated[Principal, caller("delete_fact")],
    user_id: str,
    fact_id: str,
    svc: Service,
    agent_name: AgentName = None,
) -> Fact:
    """Delete a fact; answers the fact deleted."""
    return svc.delete_fact(who, user_id, agent_name, fact_id)


@router.get(
    USER + "/export",
    tags=_TAGS,
)
def export(
    who: Annotated[Principal, caller("export")],
    user_id: str,
    svc: Service,
    agent_name: AgentName = None,
    format: Annotated[Literal["memq", "deerflow"], Query()] = "memq",
) -> dict[str, Any]:
    """The memory document as memq or DeerFlow memory.json."""
    return svc.export(who, user_id, agent_name, format=format)


class Imported(BaseModel):
    facts: int = Field(description="facts in the memory now")


@router.put(USER + "/memory", tags=_TAGS, response_model=Imported)
def import_memory(
    who: Annotated[Principal, caller("import")],
    user_id: str,
    svc: Service,
    document: Annotated[dict[str, Any], Body(description="a memq or DeerFlow memory.json")],
    agent_name: AgentName = None,
    replace: Annotated[
        bool, Query(description="empty the memory when the document holds no fact (on purpose)")
    ] = False,
) -> Imported:
    """Replace the memory with an imported memq or DeerFlow document (refused above the fact
    cap, or with no readable fact unless `replace=true`)."""
    imported, _cut = svc.import_document(who, user_id, agent_name, document, replace=replace)
    return Imported(facts=len(imported.facts))


class Forgotten(BaseModel):
    user_id: str
    removed: dict[str, int]


class ThreadForgotten(BaseModel):
    user_id: str
    thread_id: str
    removed: dict[str, int] = Field(
        description="facts_removed (learnt only from the thread), facts_trimmed (kept without "
        "its sources), sections_cleared, documents, pending, in_flight, dead, contexts, watermarks"
    )


# Declared before the user's own DELETE: `{user_id:path}` would otherwise take the whole path.
@router.delete(
    USER + f"/threads/{{thread_id:{ID}}}",
    tags=_TAGS,
    response_model=ThreadForgotten,
)
def forget_thread(
    who: Annotated[Principal, caller("forget_thread")], user_id: str, thread_id: str, svc: Service
) -> ThreadForgotten:
    """Forget one thread in every agent's memory: facts learnt only from it go, other facts lose
    its sources, its pending, in-flight and dead conversations and watermark are deleted; a run
    of it in flight saves nothing (`memq forget USER --thread T`)."""
    report = svc.forget_thread(who, user_id, thread_id)
    return ThreadForgotten(user_id=user_id, thread_id=thread_id, removed=report.as_dict())


@router.delete(USER + "", tags=_TAGS, response_model=Forgotten)
def forget(
    who: Annotated[Principal, caller("forget_user")], user_id: str, svc: Service
) -> Forgotten:
    """Erase everything held about the user: every agent's memory with its history, pending,
    in-flight and dead conversations, watermarks (`memq forget`)."""
    report = svc.forget_user(who, user_id)
    return Forgotten(user_id=user_id, removed=report.as_dict())
