"""What an agent calls around each turn (scope ``agent``): hand a conversation over, read the
memory block, the document, search, the facts, their history and provenance (why a fact is held,
what was superseded).

Query texts travel in request bodies, never in the URL, so no access log or proxy log holds them.
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from memq.operations.access import Principal
from memq.operations.paging import DEFAULT_LIMIT, needed, page
from memq.server.ids import ID
from memq.server.models import (
    TOKEN_BUDGET,
    ContextBlock,
    FactsOut,
    FactWhy,
    HandOffAccepted,
    HistoryOut,
    SupersededOut,
)
from memq.server.routing import AgentName, Cursor, Limit, Service, caller, new_router
from storage.document import MemoryDocument

router = new_router()
USER = f"/v1/users/{{user_id:{ID}}}"  # one percent-encoded segment: memq/server/ids.py
_TAGS: list[str | Enum] = ["agent"]


class HandOff(BaseModel):
    """One turn of a thread, as the agent sees it now (the whole list or the latest messages)."""

    model_config = ConfigDict(extra="forbid")

    thread_id: str = Field(description="the conversation's id in your framework")
    agent_name: str | None = Field(default=None, description="omitted: user-global memory")
    messages: list[dict[str, Any]] = Field(
        description="`{role, content}` objects (OpenAI / LangChain shapes accepted); each may say "
        "when it was said in `created_at` (ISO 8601 or epoch; default: now)"
    )
    flush: bool = Field(
        default=False, description="due now (before a summary drops messages), skip the debounce"
    )
    trace_id: str | None = Field(default=None, description="carried to the worker's log line")


@router.post(
    USER + "/conversations",
    tags=_TAGS,
    status_code=202,
    response_model=HandOffAccepted,
)
async def hand_off(
    who: Annotated[Principal, caller("hand_off")],
    user_id: str,
    body: HandOff,
    svc: Service,
) -> HandOffAccepted:
    """Hand a conversation over for extraction: 202 once Redis took it (`queued`), or once the
    server spooled it while Redis is unreachable (`spooled`, sent when Redis is back)."""
    # Over the producer's message cap the service refuses the whole list (413), never cuts it.
    # The hot path: one explicit hop to a thread for the (blocking) Redis round trip, and the
    # answer serialised here; a sync handler costs a second hop for the serialisation.
    outcome = await run_in_threadpool(
        functools.partial(
            svc.hand_off,
            who,
            user_id,
            body.agent_name,
            body.thread_id,
            body.messages,
            flush=body.flush,
            trace_id=body.trace_id,
        )
    )
    return HandOffAccepted(
        status=outcome.status,
        context_id=outcome.context_id,
        version=None if outcome.result is None else outcome.result.version,
        deadline_ms=None if outcome.result is None else outcome.result.deadline_ms,
    )


class TimeWindow(BaseModel):
    """When the facts recalled were said (both ends optional, ISO 8601 with a zone)."""

    since: AwareDatetime | None = Field(default=None, description="only facts said from then")
    until: AwareDatetime | None = Field(default=None, description="only facts said until then")


class ContextQuery(TimeWindow):
    model_config = ConfigDict(extra="forbid")

    agent_name: str | None = None
    query: str | None = Field(
        default=None, description="the user's latest message: relevant facts first"
    )
    max_tokens: int | None = Field(
        default=None,
        description="token budget (default MEMQ_INJECTED_MEMORY_MAX_TOKENS)",
        ge=TOKEN_BUDGET["ge"],
        le=TOKEN_BUDGET["le"],
    )


@router.post(USER + "/context", tags=_TAGS, response_model=ContextBlock)
def context(
    who: Annotated[Principal, caller("recall")], user_id: str, body: ContextQuery, svc: Service
) -> ContextBlock:
    """The `<user_memory>` block for the next prompt (empty when there is nothing to inject)."""
    block = svc.recall(
        who,
        user_id,
        body.agent_name,
        query=body.query,
        max_tokens=body.max_tokens,
        since=body.since,
        until=body.until,
    )
    return ContextBlock(block=block)


@router.get(USER + "/memory", tags=_TAGS, response_model=MemoryDocument)
def memory(
    who: Annotated[Principal, caller("read_memory")],
    user_id: str,
    svc: Service,
    agent_name: AgentName = None,
) -> MemoryDocument:
    """The whole memory document (memq memory.json) of the (user, agent)."""
    return svc.document(who, user_id, agent_name)


@router.get(USER + "/facts", tags=_TAGS, response_model=FactsOut)
def list_facts(
    who: Annotated[Principal, caller("read_memory")],
    user_id: str,
    svc: Service,
    agent_name: AgentName = None,
    category: str | None = None,
    limit: Limit = DEFAULT_LIMIT,
    cursor: Cursor = None,
) -> FactsOut:
    """The facts, most confident first, a page at a time."""
    facts = page(svc.list_facts(who, user_id, agent_name, category=category), limit, cursor)
    return FactsOut(facts=facts.items, next_cursor=facts.next_cursor)


class SearchQuery(TimeWindow):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1)
    agent_name: str | None = None
    category: str | None = None
    limit: int = Field(default=10, ge=1, le=200)


@router.post(USER + "/facts/search", tags=_TAGS, response_model=FactsOut)
def search_facts(
    who: Annotated[Principal, caller("search")], user_id: str, body: SearchQuery, svc: Service
) -> FactsOut:
    """The facts most relevant to a query (BM25 over English and Chinese words)."""
    found = svc.search(
        who,
        user_id,
        body.agent_name,
        body.query,
        category=body.category,
        limit=body.limit,
        since=body.since,
        until=body.until,
    )
    return FactsOut(facts=found)


@router.get(USER + "/history", tags=_TAGS, response_model=HistoryOut)
def history(
    who: Annotated[Principal, caller("history")],
    user_id: str,
    svc: Service,
    agent_name: AgentName = None,
    limit: Limit = DEFAULT_LIMIT,
    cursor: Cursor = None,
) -> HistoryOut:
    """Recorded changes of the document, newest first, a page at a time."""
    loaded = svc.history(who, user_id, agent_name, limit=needed(limit, cursor))
    changes = page(loaded, limit, cursor)
    return HistoryOut(changes=changes.items, next_cursor=changes.next_cursor)


@router.get(USER + f"/facts/{{fact_id:{ID}}}/why", tags=_TAGS, response_model=FactWhy)
def why(
    who: Annotated[Principal, caller("why")],
    user_id: str,
    fact_id: str,
    svc: Service,
    agent_name: AgentName = None,
) -> FactWhy:
    """Where a fact came from (`memq why`): its sources, confirmations, what it superseded or
    what superseded it, and its whole change history. The fact may be current, superseded or
    gone (404 when not even the history names it)."""
    return FactWhy.of(svc.why(who, user_id, agent_name, fact_id))


@router.get(USER + "/superseded", tags=_TAGS, response_model=SupersededOut)
def superseded(
    who: Annotated[Principal, caller("superseded")],
    user_id: str,
    svc: Service,
    agent_name: AgentName = None,
    limit: Limit = DEFAULT_LIMIT,
    cursor: Cursor = None,
) -> SupersededOut:
    """Facts that stopped being valid (contradicted or stale), with what replaced them and why,
    a page at a time."""
    facts = page(svc.superseded(who, user_id, agent_name), limit, cursor)
    return SupersededOut(superseded=facts.items, next_cursor=facts.next_cursor)
