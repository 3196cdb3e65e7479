"""Log in (an API key for a session cookie) and log out."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from memq.operations.access import Unauthorized
from memq.server.auth import Keyring
from memq.server.ui.access import Reader, codec, session_of
from memq.server.ui.render import render
from memq.server.ui.session import (
    COOKIE,
    CSRF_FIELD,
    LoginRequired,
    Session,
    check_csrf,
    log_in,
    new_session,
    principal_of,
)

router = APIRouter()


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


def set_session(request: Request, response: Response, session: Session) -> Response:
    response.set_cookie(
        COOKIE,
        codec(request).dump(session),
        max_age=codec(request).max_age_seconds,
        path=_base(request) or "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


def login_page(request: Request, session: Session, error: str = "", status: int = 200) -> Response:
    keyring: Keyring = request.app.state.keyring
    body = render(
        "login.html",
        {
            "base": _base(request),
            "csrf_field": CSRF_FIELD,
            "csrf": session.csrf,
            "error": error,
            "open": keyring.open,
            "who": None,
            "sees_queue": False,
        },
    )
    return set_session(request, HTMLResponse(body, status_code=status), session)


@router.get("/login", name="ui_login_form")
def login_form(request: Request) -> Response:
    """The login form; its session (no key yet) carries the form's CSRF token. A browser still
    logged in with a valid key goes on to the users."""
    session = session_of(request)
    if session is not None and session.logged_in:
        try:
            principal_of(request.app.state.keyring, session)
        except LoginRequired:
            pass
        else:
            return RedirectResponse(_base(request) + "/users", status_code=303)
    return login_page(request, new_session() if session is None or session.logged_in else session)


@router.post("/login", name="ui_login")
async def login(request: Request) -> Response:
    form = await request.form()
    session = check_csrf(session_of(request), form.get(CSRF_FIELD))
    key = form.get("key")
    keyring: Keyring = request.app.state.keyring
    try:
        fresh = log_in(keyring, key if isinstance(key, str) else "")
    except Unauthorized as exc:
        return login_page(request, session, str(exc), status=401)
    response = RedirectResponse(_base(request) + "/users", status_code=303)
    return set_session(request, response, fresh)


@router.post("/logout", name="ui_logout")
def logout(page: Reader) -> Response:
    response = RedirectResponse(page.base + "/login", status_code=303)
    response.delete_cookie(COOKIE, path=page.base or "/")
    return response
