"""Corrections by hand: add, edit and delete a fact, forget a thread, forget the user.

Each handler parses its form and calls the memory manager or the erasure exactly as the HTTP API
and the CLI do (serialised with running extractions, recorded in the history as by hand); then it
redirects to the page that shows the result, naming what was done from a fixed vocabulary.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form
from fastapi.responses import HTMLResponse, RedirectResponse

from memq.core.errors import InvalidMemoryData
from memq.server.ids import ID
from memq.server.ui.access import Changer, Page
from memq.server.ui.render import path_segment, query

router = APIRouter()
USER = f"/users/{{user_id:{ID}}}"  # one percent-encoded segment: memq/server/ids.py
# No length limits of their own: the request body cap bounds a form, and the memory manager checks
# agent names, contents and categories as everywhere else in memq.
AgentField = Annotated[str, Form()]
Content = Annotated[str, Form()]
Short = Annotated[str, Form()]


def _agent(value: str) -> str | None:
    return value or None


def _confidence(value: str) -> float | None:
    """A typed confidence; blank: not given."""
    if not value.strip():
        return None
    try:
        return float(value)
    except ValueError:
        raise InvalidMemoryData("confidence must be a number between 0 and 1") from None


def _given(confidence: float | None) -> float:
    if confidence is None:
        raise InvalidMemoryData("confidence must be a number between 0 and 1")
    return confidence


def _back(page: Page, user_id: str, path: str, **params: Any) -> RedirectResponse:
    url = f"{page.base}/users/{path_segment(user_id)}{path}{query(params)}"
    return RedirectResponse(url, status_code=303)


@router.post(USER + "/facts", name="ui_add_fact")
def add_fact(
    user_id: str,
    page: Changer,
    content: Content,
    agent: AgentField = "",
    category: Short = "context",
    confidence: Short = "0.9",
) -> RedirectResponse:
    fact = page.svc.add_fact(
        page.principal,
        user_id,
        _agent(agent),
        content,
        category=category,
        confidence=_given(_confidence(confidence)),
    )
    return _back(page, user_id, f"/facts/{path_segment(fact.id)}", agent=agent, done="added")


@router.post(USER + f"/facts/{{fact_id:{ID}}}/edit", name="ui_edit_fact")
def edit_fact(
    user_id: str,
    fact_id: str,
    page: Changer,
    content: Content = "",
    agent: AgentField = "",
    category: Short = "",
    confidence: Short = "",
) -> RedirectResponse:
    page.svc.edit_fact(
        page.principal,
        user_id,
        _agent(agent),
        fact_id,
        content=content or None,
        category=category or None,
        confidence=_confidence(confidence),
    )
    return _back(page, user_id, f"/facts/{path_segment(fact_id)}", agent=agent, done="edited")


@router.post(USER + f"/facts/{{fact_id:{ID}}}/delete", name="ui_delete_fact")
def delete_fact(
    user_id: str, fact_id: str, page: Changer, agent: AgentField = ""
) -> RedirectResponse:
    page.svc.delete_fact(page.principal, user_id, _agent(agent), fact_id)
    return _back(page, user_id, "/memory", agent=agent, done="deleted")


@router.post(USER + f"/facts/{{fact_id:{ID}}}/restore", name="ui_restore_fact")
def restore_fact(
    user_id: str, fact_id: str, page: Changer, agent: AgentField = ""
) -> RedirectResponse:
    """Make a superseded or deleted fact current again, whole (as it was)."""
    page.svc.restore_fact(page.principal, user_id, _agent(agent), fact_id)
    return _back(page, user_id, f"/facts/{path_segment(fact_id)}", agent=agent, done="restored")


@router.post(USER + "/threads/forget", name="ui_forget_thread")
def forget_thread(
    user_id: str, page: Changer, thread_id: Short, agent: AgentField = ""
) -> RedirectResponse:
    """Forget what one thread taught, in every agent's memory (as the HTTP API and the CLI)."""
    report = page.svc.forget_thread(page.principal, user_id, thread_id)
    done = "thread-forgotten" if any(report.as_dict().values()) else "thread-unknown"
    return _back(page, user_id, "", done=done)


@router.post(USER + "/forget", name="ui_forget_user")
def forget_user(user_id: str, page: Changer, confirm: Short = "") -> HTMLResponse:
    """Erase everything held about the user, once the user id is typed back exactly."""
    if confirm != user_id:
        raise InvalidMemoryData("not forgotten: type the user id exactly to confirm")
    report = page.svc.forget_user(page.principal, user_id)
    return page.html("forgotten.html", user_id=user_id, removed=report.as_dict())


@router.post(USER + f"/facts/{{fact_id:{ID}}}/never-again", name="ui_forget_fact")
def forget_fact(
    user_id: str, fact_id: str, page: Changer, agent: AgentField = ""
) -> RedirectResponse:
    """Delete the fact and put it on the memory's do-not-learn list."""
    page.svc.never_learn(page.principal, user_id, _agent(agent), fact_id)
    return _back(page, user_id, "/memory", agent=agent, tab="do-not-learn", done="forgotten")


@router.post(USER + "/do-not-learn", name="ui_block")
def block(
    user_id: str, page: Changer, content: Content, agent: AgentField = ""
) -> RedirectResponse:
    page.svc.block(page.principal, user_id, _agent(agent), content)
    return _back(page, user_id, "/memory", agent=agent, tab="do-not-learn", done="blocked")


@router.post(USER + "/do-not-learn/remove", name="ui_unblock")
def unblock(
    user_id: str, page: Changer, content: Content, agent: AgentField = ""
) -> RedirectResponse:
    page.svc.unblock(page.principal, user_id, _agent(agent), content)
    return _back(page, user_id, "/memory", agent=agent, tab="do-not-learn", done="unblocked")


@router.post(USER + "/summaries/{section}", name="ui_edit_summary")
def edit_summary(
    user_id: str, section: str, page: Changer, summary: Content = "", agent: AgentField = ""
) -> RedirectResponse:
    """Correct one summary by hand (recorded old → new, as a fact edit is)."""
    page.svc.edit_summary(page.principal, user_id, _agent(agent), section, summary)
    return _back(page, user_id, "/memory", agent=agent, tab="summaries", done="summary-edited")
