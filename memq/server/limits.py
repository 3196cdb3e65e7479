"""The request guard: body-size cap (413 before the body is read whole), a 500 that logs no
text, and an access log that holds no path parameter, query string or body."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memq.server.problems import PROBLEM_JSON, problem_body

log = logging.getLogger("memq.server")
access_log = logging.getLogger("memq.server.access")


def _problem_bytes(status: int, detail: str) -> bytes:
    return json.dumps(problem_body(status, detail)).encode("utf-8")


# A refusal as an HTML page and its own headers (its security policy) for the requests that want
# one (the inspector's), else None.
PageFor = Callable[[Scope, int, str], tuple[bytes, list[tuple[bytes, bytes]]] | None]


class RequestGuard:
    """Outermost middleware of the app (inside Starlette's own error middleware). ``page_for``
    answers its refusals of inspector requests as pages; every other request gets problem+json."""

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, page_for: PageFor | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.page_for = page_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: list[int] = [0]
        cap = self.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > cap:
                    await self._send_problem(scope, send, 413, self._too_large())
                    self._log(scope, 413, started)
                    return
        received = [0]
        over = [False]

        async def counted_receive() -> Message:
            if over[0]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received[0] += len(message.get("body", b""))
                if received[0] > cap:
                    # The app stops reading as if the client had gone; whatever it answers
                    # then is replaced by the 413 below.
                    over[0] = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if over[0]:
                if message["type"] == "http.response.start" and not status[0]:
                    status[0] = 413
                    await self._send_problem(scope, send, 413, self._too_large())
                return
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception as exc:  # the type only: its text may quote the caller's input
            if not over[0]:
                log.error("memq serve: unexpected %s on %s", type(exc).__name__, _route(scope))
            if not status[0]:
                status[0] = 413 if over[0] else 500
                detail = self._too_large() if over[0] else "internal error; see the server log"
                await self._send_problem(scope, send, status[0], detail)
        if over[0] and not status[0]:
            status[0] = 413
            await self._send_problem(scope, send, 413, self._too_large())
        self._log(scope, status[0], started)

    def _too_large(self) -> str:
        return f"request body above {self.max_body_bytes} bytes (MEMQ_SERVE_MAX_BODY_BYTES)"

    async def _send_problem(self, scope: Scope, send: Send, status: int, detail: str) -> None:
        page = self.page_for(scope, status, detail) if self.page_for is not None else None
        body, extra = page if page is not None else (_problem_bytes(status, detail), [])
        kind = "text/html; charset=utf-8" if page is not None else PROBLEM_JSON
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", kind.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def _log(scope: Scope, status: int, started: float) -> None:
        if access_log.isEnabledFor(logging.INFO):
            elapsed_ms = (time.perf_counter() - started) * 1000
            access_log.info("%s %s %d %.1fms", scope["method"], _route(scope), status, elapsed_ms)


def _route(scope: dict[str, Any] | Scope) -> str:
    """The route's template (``/v1/users/{user_id}/memory``), never the path itself: a path
    holds user ids and a query string may hold a user's words."""
    route = scope.get("route")
    # `path_format`: the template without its convertors (`{user_id}`, not `{user_id:memqid}`).
    template = (
        getattr(route, "path_format", None)
        or getattr(route, "path", None)
        or getattr(scope.get("endpoint"), "template", None)
    )
    return str(template or "(no route)")
