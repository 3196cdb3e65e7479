"""The reading pages: users, one user's memories, a memory's facts, one fact, the preview."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Form, Query
from fastapi.responses import HTMLResponse, RedirectResponse

from memq.server.ids import ID
from memq.server.models import TOKEN_BUDGET
from memq.server.ui import views
from memq.server.ui.access import Page, Reader, Viewer
from producer.injector import wrapped
from prompts.injection import RELEVANCE_WEIGHT
from prompts.tokens import make_token_counter
from storage.base import Change
from storage.document import DO_NOT_LEARN_MAX, Fact, MemoryDocument

router = APIRouter()
# `:path`: a user id may hold `/` (sent as `%2F`, which the server decodes before routing). So the
# user's own page, whose pattern matches every longer path too, is declared last.
USER = f"/users/{{user_id:{ID}}}"  # one percent-encoded segment: memq/server/ids.py
TABS = ("facts", "summaries", "superseded", "history", "do-not-learn", "transfer")
# The history is bounded by history_max_entries: read all of it, page it here.
WHOLE_HISTORY = 1_000_000
# The agent name is checked by the storage, as everywhere in memq (an invalid one is a 422 page).
AgentParam = Annotated[str | None, Query(alias="agent")]


def _agent(value: str | None) -> str | None:
    return value if value else None


@router.get("/", name="ui_home")
def home(page: Viewer) -> RedirectResponse:
    return RedirectResponse(page.base + "/users", status_code=303)


@dataclass(frozen=True)
class UserRow:
    user_id: str
    agents: list[str | None]
    facts: int
    last_activity: datetime | None


def _user_row(page: Page, user_id: str) -> UserRow:
    """What the users list says of one user: their memories, facts and last change."""
    memories = _documents(page, user_id)
    stamps = [d.last_updated for _, d in memories if d.last_updated is not None]
    facts = sum(len(d.facts) for _, d in memories)
    return UserRow(user_id, [a for a, _ in memories], facts, max(stamps, default=None))


@router.get("/users", name="ui_users")
def users(
    page: Viewer,
    prefix: Annotated[str, Query(max_length=200)] = "",
    after: Annotated[str, Query(max_length=1000)] = "",
) -> HTMLResponse:
    """A page of the users whose id starts with ``prefix`` (a key bound to a prefix sees only its
    own), in id order, each with their memories, fact count and last activity."""
    everyone = page.svc.list_users(page.principal)
    found = views.paged(
        (u for u in everyone if u.startswith(prefix)), lambda u: (u,), after=after or None
    )
    return page.html(
        "users.html",
        prefix=prefix,
        users=[_user_row(page, u) for u in found.rows],
        listing=found,
        total=len(everyone),
    )


@router.get(USER + "/memory", name="ui_memory")
def memory(
    user_id: str,
    page: Viewer,
    agent: AgentParam = None,
    tab: Annotated[str, Query(max_length=20)] = "facts",
    sort: Annotated[str, Query(max_length=20)] = "confidence",
    order: Annotated[str, Query(max_length=4)] = "desc",
    category: Annotated[str, Query(max_length=100)] = "",
    text: Annotated[str, Query(max_length=500)] = "",
    done: Annotated[str, Query(max_length=20)] = "",
    after: Annotated[str, Query(max_length=1000)] = "",
) -> HTMLResponse:
    """One memory, a page at a time: its facts (sorted, by category, or the relevance search the
    API answers), summaries, superseded facts and history."""
    agent_name = _agent(agent)
    svc, who = page.svc, page.principal
    document = svc.document(who, user_id, agent_name)
    key = views.sort_key(sort)
    tab = tab if tab in TABS else "facts"
    cursor = after or None
    facts = views.Paged[Fact]([], None, 0, 0)
    if tab == "facts" and text.strip():
        # The API's own search (MemoryManager.search), best first: one page of the best matches.
        found = svc.search(
            who, user_id, agent_name, text, category=category or None, limit=views.PAGE_SIZE
        )
        facts = views.Paged(found, None, 0, len(found))
    elif tab == "facts":
        facts = views.fact_table(
            document.facts,
            sort=key,
            descending=order != "asc",
            category=category or None,
            after=cursor,
        )
    superseded = views.superseded(document)
    history = views.Paged[Change]([], None, 0, 0)
    if tab == "history":
        changes = svc.history(who, user_id, agent_name, limit=WHOLE_HISTORY)
        history = views.history_page(changes, cursor)
    return page.html(
        "memory.html",
        user_id=user_id,
        agent=agent_name,
        document=document,
        tab=tab,
        facts=facts,
        total=len(document.facts),
        categories=views.categories(document.facts),
        category=category,
        contains=text,
        sort=key,
        order="asc" if order == "asc" else "desc",
        confirmations=views.confirmations,
        superseded=views.superseded_page(superseded, cursor) if tab == "superseded" else None,
        superseded_total=len(superseded),
        history=history,
        do_not_learn_max=DO_NOT_LEARN_MAX,
        caps={
            "facts": svc.settings.max_facts,
            "chars": svc.settings.fact_max_chars,
            "bytes": svc.settings.serve_max_body_bytes,
        },
        notice=views.NOTICES.get(done, ""),
    )


@router.get(USER + f"/facts/{{fact_id:{ID}}}", name="ui_fact")
def fact(
    user_id: str,
    fact_id: str,
    page: Viewer,
    agent: AgentParam = None,
    done: Annotated[str, Query(max_length=20)] = "",
) -> HTMLResponse:
    """One fact: where it came from, its history, what it superseded (or what superseded it)."""
    from memq.core.errors import NotFound

    agent_name = _agent(agent)
    svc, who = page.svc, page.principal
    document = svc.document(who, user_id, agent_name)
    entries = views.superseded(document)
    current = document.fact(fact_id)
    retired = views.superseded_fact(entries, fact_id)
    changes = svc.history(who, user_id, agent_name, limit=WHOLE_HISTORY)
    deleted = views.deleted(changes, fact_id) if current is None and retired is None else None
    shown = current or (retired.fact if retired else None) or (deleted.fact if deleted else None)
    if shown is None:
        raise NotFound(f"no fact {fact_id!r} in this memory (nor in its kept history)")
    return page.html(
        "fact.html",
        user_id=user_id,
        agent=agent_name,
        fact=shown,
        current=current is not None,
        retired=retired,
        deleted=deleted,
        edits=views.edits(views.fact_history(changes, fact_id)),
        sources=views.sources(shown),
        confirmations=views.confirmations(shown),
        history=views.fact_history(changes, fact_id),
        replaced=views.superseded_by(entries, fact_id),
        categories=views.categories(document.facts),
        notice=views.NOTICES.get(done, ""),
    )


@router.get(USER + "/preview", name="ui_preview_form")
def preview_form(user_id: str, page: Viewer, agent: AgentParam = None) -> HTMLResponse:
    return page.html(
        "preview.html",
        user_id=user_id,
        agent=_agent(agent),
        query_text="",
        budget=page.svc.settings.injected_memory_max_tokens,
        result=None,
    )


@router.post(USER + "/preview", name="ui_preview")
def preview(
    user_id: str,
    page: Reader,
    agent: Annotated[str, Form()] = "",
    query_text: Annotated[str, Form(alias="query")] = "",
    budget: Annotated[int | None, Form(ge=TOKEN_BUDGET["ge"], le=TOKEN_BUDGET["le"])] = None,
) -> HTMLResponse:
    """Exactly the block an agent gets for this query and budget (the injector's own call), its
    token count, and the facts it left out. A POST so the query never sits in a URL."""
    agent_name = _agent(agent)
    svc = page.svc
    # The injector's own decision for this budget: the block the API returns, and what it left out.
    who = page.principal
    plan = svc.recall_plan(who, user_id, agent_name, query=query_text or None, max_tokens=budget)
    block = wrapped(plan.text)
    count = make_token_counter(svc.settings.token_counting)
    return page.html(
        "preview.html",
        user_id=user_id,
        agent=agent_name,
        query_text=query_text,
        budget=budget or svc.settings.injected_memory_max_tokens,
        result={
            "block": block,
            "tokens": count(block) if block else 0,
            "left_out": plan.left_out,
            "weight": RELEVANCE_WEIGHT,
            "total": len(svc.document(who, user_id, agent_name).facts),
        },
    )


def _documents(page: Page, user_id: str) -> list[tuple[str | None, MemoryDocument]]:
    svc, who = page.svc, page.principal
    agents = sorted(svc.list_agents(who, user_id), key=lambda a: (a is not None, a or ""))
    return [(a, svc.document(who, user_id, a)) for a in agents]


@router.get(USER + "/thread", name="ui_thread")
def thread(
    user_id: str, page: Viewer, thread_id: Annotated[str, Query(alias="id", max_length=1000)]
) -> HTMLResponse:
    """What forgetting one thread would do, memory by memory: the storage's own decision
    (:func:`storage.provenance.forget_thread`) on the documents as they are now."""
    from storage.provenance import forget_thread, section_threads

    effects = []
    for agent, document in _documents(page, user_id):
        history = page.svc.history(page.principal, user_id, agent, limit=WHOLE_HISTORY)
        _, result = forget_thread(
            document, thread_id, section_threads=section_threads(list(reversed(history)))
        )
        if result.changed:
            gone = set(result.removed)
            removed = [f for f in document.facts if f.id in gone]
            removed += [e.fact for e in document.superseded if e.fact.id in gone]
            effects.append((agent, removed, result.trimmed, result.sections_cleared))
    return page.html("thread.html", user_id=user_id, thread_id=thread_id, effects=effects)


@router.get(USER + "/all", name="ui_user_all")
def every_memory(
    user_id: str, page: Viewer, text: Annotated[str, Query(max_length=500)] = ""
) -> HTMLResponse:
    """Every memory of the user side by side (the user-global one first): each one's best facts,
    or, given a search, each one's best matches by the API's own search (the service's
    ``search``, as ``POST /v1/users/{id}/facts/search`` answers it per memory)."""
    svc, who = page.svc, page.principal
    columns = []
    for agent, document in _documents(page, user_id):
        if text.strip():
            shown = svc.search(who, user_id, agent, text, limit=views.PER_MEMORY)
        else:
            shown = views.fact_table(document.facts, limit=views.PER_MEMORY).rows
        columns.append(views.MemoryColumn(agent, shown, len(document.facts)))
    return page.html("all.html", user_id=user_id, columns=columns, text=text)


@router.get(USER, name="ui_user")
def user(
    user_id: str, page: Viewer, done: Annotated[str, Query(max_length=20)] = ""
) -> HTMLResponse:
    """The user's memories (one per agent, and the user-global one) with their fact counts, and
    the threads their facts were learnt from."""
    documents = _documents(page, user_id)
    rows = [(a, len(d.facts), len(d.superseded)) for a, d in documents]
    return page.html(
        "user.html",
        user_id=user_id,
        rows=rows,
        threads=views.threads(documents),
        notice=views.NOTICES.get(done, ""),
    )
