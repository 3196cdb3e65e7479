"""Who may see and change what in the inspector: the one dependency every page declares.

:class:`Access` mirrors the HTTP API's ``Authorize``: the session's key (looked up in the same
keyring) must hold the page's scope, reach the ``{user_id}`` in its path (a key bound to a user-id
prefix sees only those users) and, for the queue, span every user. Every POST (``form=True``)
must carry the session's CSRF token in its form; a change also needs the ``admin`` scope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse

from memq.operations.access import Principal, Scope
from memq.operations.service import MemqService
from memq.server.auth import Keyring
from memq.server.ui.i18n import COOKIE as LANG_COOKIE
from memq.server.ui.i18n import choose
from memq.server.ui.render import render
from memq.server.ui.session import (
    COOKIE,
    CSRF_FIELD,
    LoginRequired,
    Session,
    SessionCodec,
    check_csrf,
    principal_of,
)
from storage.vocabulary import CATEGORIES


@dataclass(frozen=True)
class Page:
    """What a handler gets: the request, the caller, their session and memq's handles."""

    request: Request
    principal: Principal
    session: Session
    svc: MemqService

    @property
    def base(self) -> str:
        """The inspector's own path (``/ui``, under any root path a proxy serves memq at)."""
        return str(self.request.scope.get("root_path", ""))

    @property
    def can_change(self) -> bool:
        return "admin" in self.principal.scopes

    @property
    def sees_queue(self) -> bool:
        return self.can_change and self.principal.user_prefix is None

    def html(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(render(template, {**self.common(), **context}), status_code=status)

    def common(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "csrf_field": CSRF_FIELD,
            "csrf": self.session.csrf,
            "who": self.principal.name,
            "can_change": self.can_change,
            "sees_queue": self.sees_queue,
            "user_prefix": self.principal.user_prefix,
            "known_categories": CATEGORIES,
            "lang": language_of(self.request),
            "here_path": here_path(self.request),
        }


def language_of(request: Request) -> str:
    """The page's language: the switch's cookie, else the browser's Accept-Language."""
    return choose(request.cookies.get(LANG_COOKIE), request.headers.get("accept-language"))


def here_path(request: Request) -> str:
    """This page's address inside the inspector (with its query), for the language switch."""
    path, base = str(request.scope.get("path", "")), str(request.scope.get("root_path", ""))
    path = path.removeprefix(base) if base else path
    return path + ("?" + request.url.query if request.url.query else "")


def codec(request: Request) -> SessionCodec:
    return request.app.state.session_codec  # type: ignore[no-any-return]


def session_of(request: Request) -> Session | None:
    return codec(request).load(request.cookies.get(COOKIE))


class Access:
    """``Depends(Access("agent"))`` on a page, ``Depends(Access("admin", form=True))`` on the
    handler of a form that changes memory; ``all_users`` for pages that span every user."""

    def __init__(self, scope: Scope, *, form: bool = False, all_users: bool = False) -> None:
        self.scope: Scope = scope
        self.form = form
        self.all_users = all_users

    def __repr__(self) -> str:
        return f"Access({self.scope!r}, form={self.form}, all_users={self.all_users})"

    async def __call__(self, request: Request) -> Page:
        keyring: Keyring = request.app.state.keyring
        session = session_of(request)
        if session is None:
            raise LoginRequired("log in first")
        principal = principal_of(keyring, session)
        if self.form:
            form = await request.form()
            check_csrf(session, form.get(CSRF_FIELD))
        principal.require_scope(self.scope)
        user_id = request.path_params.get("user_id")
        if user_id is not None:
            principal.require_user(str(user_id))
        if self.all_users:
            principal.require_all_users()
        return Page(request, principal, session, request.app.state.service)


VIEW = Access("agent")
# A page only an admin key may see (an export holds the whole memory, as the API's export).
ADMIN_VIEW = Access("admin")
# A POST that changes nothing (the preview's query travels in a body, not the URL; logging out).
READ_FORM = Access("agent", form=True)
CHANGE = Access("admin", form=True)
QUEUE = Access("admin", all_users=True)
QUEUE_CHANGE = Access("admin", form=True, all_users=True)

Viewer = Annotated[Page, Depends(VIEW)]
AdminViewer = Annotated[Page, Depends(ADMIN_VIEW)]
Changer = Annotated[Page, Depends(CHANGE)]
QueueViewer = Annotated[Page, Depends(QUEUE)]
QueueChanger = Annotated[Page, Depends(QUEUE_CHANGE)]
Reader = Annotated[Page, Depends(READ_FORM)]
