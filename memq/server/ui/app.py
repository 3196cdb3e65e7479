"""``build_inspector(settings, keyring, service)`` → the inspector's app, mounted at ``/ui``.

Its own small app, so its errors are pages rather than ``problem+json`` and its route table can
be swept on its own; it shares the server's keyring and memq handles.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from http import HTTPStatus
from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from memq.core.connection import REDIS_ERRORS
from memq.core.errors import MemqError
from memq.core.settings import MemqSettings
from memq.operations.refusals import reason, status_of
from memq.operations.service import MemqService
from memq.server.auth import Keyring
from memq.server.ui.access import Page, language_of, session_of
from memq.server.ui.render import NO_STORE, SECURITY_HEADERS, SecurityHeaders, render
from memq.server.ui.session import LoginRequired, SessionCodec, principal_of

log = logging.getLogger("memq.server.ui")
GuardPage = tuple[bytes, list[tuple[bytes, bytes]]]


def build_inspector(settings: MemqSettings, keyring: Keyring, service: MemqService) -> FastAPI:
    from memq.server.ui import (
        routes_correct,
        routes_memory,
        routes_queue,
        routes_session,
        routes_transfer,
    )

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    secret = (
        settings.serve_session_secret.get_secret_value()
        if settings.serve_session_secret is not None
        else secrets.token_urlsafe(32)
    )
    app.state.session_codec = SessionCodec(secret, settings.serve_session_max_age_seconds)
    app.state.keyring = keyring
    app.state.service = service
    for module in (routes_session, routes_transfer, routes_memory, routes_correct, routes_queue):
        app.router.routes.extend(module.router.routes)
    static = files("memq.server.ui").joinpath("static")
    app.mount("/static", StaticFiles(directory=str(static)), name="ui_static")
    app.add_exception_handler(MemqError, on_error)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_crash)
    for kind in REDIS_ERRORS:
        app.add_exception_handler(kind, on_error)
    app.add_middleware(SecurityHeaders)
    return app


def warm_pages() -> None:
    """Compile every template in every language (its catalogue included), so the first page
    costs what later ones do. The server's lifespan calls it at start, before it accepts a
    request, beside the injector's warm-up of the tokenizer and the Chinese segmenter (a thread
    racing the first requests lost under load: the first preview once took seconds)."""
    from memq.server.ui.i18n import CODES
    from memq.server.ui.render import environment

    try:
        for code in CODES:
            env = environment(code)
            for name in env.list_templates(extensions=["html"]):
                env.get_template(name)
    except Exception:  # a warm-up is an optimisation: never a reason to fail the server
        log.exception("inspector warm-up failed")


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """An error as a page inside the layout: with the navigation and the logout button when the
    request carries a valid session, as every other page (a bare page strands the operator)."""
    context: dict[str, object] = {
        "base": str(request.scope.get("root_path", "")),
        "who": None,
        "sees_queue": False,
        "lang": language_of(request),
    }
    session = session_of(request)
    if session is not None:
        try:
            principal = principal_of(request.app.state.keyring, session)
        except LoginRequired:
            pass
        else:
            context = Page(request, principal, session, request.app.state.service).common()
    body = render(
        "error.html",
        {**context, "status": status, "title": HTTPStatus(status).phrase, "message": message},
    )
    return HTMLResponse(body, status_code=status)


def guard_pages(inspector: FastAPI) -> Callable[[Scope, int, str], GuardPage | None]:
    """What the server's request guard answers an inspector request it refuses (a body above the
    cap): the inspector's error page with its headers; None for every other request."""

    def page_for(scope: Scope, status: int, detail: str) -> GuardPage | None:
        root = str(scope.get("root_path", ""))
        path = str(scope.get("path", ""))
        inner = path.removeprefix(root) if root else path
        if inner != "/ui" and not inner.startswith("/ui/"):
            return None
        request = Request({**scope, "app": inspector, "root_path": root + "/ui"})
        return bytes(error_page(request, status, detail).body), [*SECURITY_HEADERS, NO_STORE]

    return page_for


async def on_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals under /ui (no such page, a method the page does not take) as
    pages, where the HTTP API answers problem+json."""
    status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
    if status == 404:
        return error_page(request, 404, "there is no such page in the inspector")
    if status == 405:
        return error_page(request, 405, "this address takes a form's button, not a visit")
    return error_page(request, status, HTTPStatus(status).description or HTTPStatus(status).phrase)


async def on_crash(request: Request, exc: Exception) -> Response:
    """An unexpected failure: a page saying so; its type goes to the log (never its text, which
    may quote stored memory), as the HTTP API's guard logs it."""
    return error_page(request, 500, "internal error; see the server log")


async def on_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, LoginRequired):
        return RedirectResponse(str(request.scope.get("root_path", "")) + "/login", 303)
    status = status_of(exc)
    if status == 503:
        log.warning("inspector: storage error %s", type(exc).__name__)
    elif status >= 500:
        log.error("inspector: %s", type(exc).__name__)
    return error_page(request, status, reason(exc))


async def on_invalid(request: Request, exc: Exception) -> Response:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query"))
    return error_page(request, 422, f"{where or 'form'}: {first.get('msg', 'invalid')}")
