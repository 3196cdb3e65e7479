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

from memq.commands.common import CommandError
from memq.core.connection import REDIS_ERRORS
from memq.core.errors import (
    ConfigError,
    FactEvicted,
    FactNotFound,
    InvalidIdentifier,
    InvalidMemoryData,
    InvalidMessages,
    MemqError,
    RedisUnavailable,
    StorageError,
)
from memq.server.auth import Forbidden, Unauthorized

log = logging.getLogger("memq.server")

PROBLEM_JSON = "application/problem+json"
MAX_LISTED_ERRORS = 10


class NotFound(MemqError, LookupError):
    """The user, agent or dead letter asked for does not exist: 404."""


class PayloadTooLarge(MemqError, ValueError):
    """A body or a message list above the configured cap: 413."""


# Most specific first: the first class an error is an instance of decides its status.
STATUS_OF: tuple[tuple[type[BaseException], int], ...] = (
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (FactNotFound, 404),
    (PayloadTooLarge, 413),
    (FactEvicted, 409),
    (InvalidIdentifier, 422),
    (CommandError, 422),
    (InvalidMessages, 422),
    (InvalidMemoryData, 422),
    (RedisUnavailable, 503),
    (StorageError, 503),
    (ConfigError, 500),
)


def status_of(exc: BaseException) -> int:
    for kind, status in STATUS_OF:
        if isinstance(exc, kind):
            return status
    if isinstance(exc, REDIS_ERRORS):
        return 503
    return 500


def problem(status: int, detail: str, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        **extra,
    }
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]


def _location(loc: tuple[Any, ...] | list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "request"


async def on_memq_error(request: Request, exc: Exception) -> JSONResponse:
    status = status_of(exc)
    if status >= 500 and not isinstance(exc, RedisUnavailable | StorageError):
        log.error("memq serve: %s on %s", type(exc).__name__, _route(request))
        return problem(status, "internal error; see the server log")
    if status == 503:
        return problem(503, "storage unavailable; retry later")
    return problem(status, _first_line(exc))


async def on_redis_error(request: Request, exc: Exception) -> JSONResponse:
    log.warning("memq serve: Redis error %s on %s", type(exc).__name__, _route(request))
    return problem(503, "storage unavailable; retry later")


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
