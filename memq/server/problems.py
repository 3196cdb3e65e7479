"""Every error as one ``application/problem+json`` body (RFC 9457): status, title, one line.

The detail names what is wrong and never repeats what the caller sent (a body may hold a user's
words; a header may hold a key). Unexpected errors are logged by type only and answered 500.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from memq.core.connection import REDIS_ERRORS
from memq.core.errors import MemqError
from memq.operations.refusals import UNAVAILABLE, reason, status_of

log = logging.getLogger("memq.server")

PROBLEM_JSON = "application/problem+json"
MAX_LISTED_ERRORS = 10


def problem_body(status: int, detail: str, **extra: Any) -> dict[str, Any]:
    """The one problem+json body (RFC 9457) of every error answer."""
    return {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        **extra,
    }


def problem(status: int, detail: str, **extra: Any) -> JSONResponse:
    body = problem_body(status, detail, **extra)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _location(loc: tuple[Any, ...] | list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "request"


async def on_memq_error(request: Request, exc: Exception) -> JSONResponse:
    status = status_of(exc)
    if status >= 500 and status != 503:
        log.error("memq serve: %s on %s", type(exc).__name__, _route(request))
    return problem(status, reason(exc))


async def on_redis_error(request: Request, exc: Exception) -> JSONResponse:
    log.warning("memq serve: Redis error %s on %s", type(exc).__name__, _route(request))
    return problem(503, UNAVAILABLE)


async def on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": _location(error.get("loc", ())), "msg": str(error.get("msg", "invalid"))}
        for error in exc.errors()[:MAX_LISTED_ERRORS]
    ]
    first = errors[0] if errors else {"loc": "request", "msg": "invalid"}
    more = len(exc.errors()) - 1
    detail = f"{first['loc']}: {first['msg']}" + (f" (and {more} more)" if more > 0 else "")
    return problem(422, detail, errors=errors)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc.__cause__, RecursionError):  # json.loads of a too deeply nested body
        return problem(422, "body: JSON nested too deeply")
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    response = problem(exc.status_code, detail)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


def _route(request: Request) -> str:
    route = request.scope.get("route")
    return f"{request.method} {getattr(route, 'path', '?')}"


def install(app: FastAPI) -> None:
    app.add_exception_handler(MemqError, on_memq_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    for kind in REDIS_ERRORS:
        app.add_exception_handler(kind, on_redis_error)
    # Anything else is answered 500 by the guard middleware (memq.server.limits), which sees it
    # before Starlette's own error middleware would log its text.
