"""The reading pages: users, one user's memories, a memory's facts, one fact, the preview."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Query
from fastapi.responses import HTMLResponse, RedirectResponse

from memq.server.ids import ID
from memq.server.models import TOKEN_BUDGET
from memq.server.ui import views
from memq.server.ui.access import Reader, Viewer
from prompts.tokens import make_token_counter

router = APIRouter()
# `:path`: a user id may hold `/` (sent as `%2F`, which the server decodes before routing). So the
# user's own page, whose pattern matches every longer path too, is declared last.
USER = f"/users/{{user_id:{ID}}}"  # one percent-encoded segment: memq/server/ids.py
# Users listed at once: a prefix narrows a deployment of millions to a page.
MAX_LISTED_USERS = 200
# The agent name is checked by the storage, as everywhere in memq (an invalid one is a 422 page).
AgentParam = Annotated[str | None, Query(alias="agent")]


def _agent(value: str | None) -> str | None:
    return value if value else None


@router.get("/", name="ui_home")
def home(page: Viewer) -> RedirectResponse:
    return RedirectResponse(page.base + "/users", status_code=303)


@router.get("/users", name="ui_users")
def users(page: Viewer, prefix: Annotated[str, Query(max_length=200)] = "") -> HTMLResponse:
    """Users whose id starts with ``prefix`` (a key bound to a prefix sees only its own)."""
    bound = page.principal.user_prefix or ""
    everyone = sorted(u for u in page.svc.manager.list_users() if u.startswith(bound))
    found = [u for u in everyone if u.startswith(prefix)]
    return page.html(
        "users.html",
        prefix=prefix,
        users=found[:MAX_LISTED_USERS],
        more=max(0, len(found) - MAX_LISTED_USERS),
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
) -> HTMLResponse:
    """One memory: its facts (sorted, filtered), summaries, superseded facts and history."""
    agent_name = _agent(agent)
    manager = page.svc.manager
    document = manager.document(user_id, agent_name=agent_name)
    key = views.sort_key(sort)
    facts = views.fact_table(
        document.facts,
        sort=key,
        descending=order != "asc",
        category=category or None,
        text=text,
    )
    history = manager.history(user_id, agent_name=agent_name, limit=200) if tab == "history" else []
    return page.html(
        "memory.html",
        user_id=user_id,
        agent=agent_name,
        document=document,
        tab=tab if tab in ("facts", "summaries", "superseded", "history") else "facts",
        facts=facts,
        total=len(document.facts),
        categories=views.categories(document.facts),
        category=category,
        contains=text,
        sort=key,
        order="asc" if order == "asc" else "desc",
        sort_keys=views.SORT_KEYS,
        confirmations=views.confirmations,
        superseded=views.superseded(document),
        history=history,
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
    manager = page.svc.manager
    document = manager.document(user_id, agent_name=agent_name)
    entries = views.superseded(document)
    current = document.fact(fact_id)
    retired = views.superseded_fact(entries, fact_id)
    shown = current if current is not None else (retired.fact if retired else None)
    if shown is None:
        raise NotFound(f"no fact {fact_id!r} in this memory")
    changes = manager.history(user_id, agent_name=agent_name, limit=1000)
    return page.html(
        "fact.html",
        user_id=user_id,
        agent=agent_name,
        fact=shown,
        current=current is not None,
        retired=retired,
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
    block = svc.recall(
        page.principal, user_id, agent_name, query=query_text or None, max_tokens=budget
    )
    count = make_token_counter(svc.settings.token_counting)
    document = svc.manager.document(user_id, agent_name=agent_name)
    return page.html(
        "preview.html",
        user_id=user_id,
        agent=agent_name,
        query_text=query_text,
        budget=budget or svc.settings.injected_memory_max_tokens,
        result={
            "block": block,
            "tokens": count(block) if block else 0,
            "left_out": views.left_out(document.facts, block),
            "total": len(document.facts),
        },
    )


@router.get(USER, name="ui_user")
def user(user_id: str, page: Viewer) -> HTMLResponse:
    """The user's memories (one per agent, and the user-global one) with their fact counts."""
    manager = page.svc.manager
    agents = manager.list_agents(user_id)
    rows = []
    for agent in sorted(agents, key=lambda a: (a is not None, a or "")):
        document = manager.document(user_id, agent_name=agent)
        rows.append((agent, len(document.facts), len(views.superseded(document))))
    return page.html("user.html", user_id=user_id, rows=rows)
