"""Ids in URL paths: every user, agent and thread id reaches its own route.

An id may hold ``/`` (``slack/C1``), ``%``, dots, or end like a longer route (``app1-bob/facts/F``,
``x/memory``). Starlette routes on the *decoded* path, where ``%2F`` is already ``/``: the id
``app1-bob/facts/F`` of ``DELETE /v1/users/app1-bob%2Ffacts%2FF`` then matched "delete fact F of
app1-bob". So the app routes on the raw path instead: :class:`RawPathRouting` rebuilds the path
segment by segment, keeping a ``/`` that was encoded inside a segment as :data:`SEPARATOR` (a
control character no id may hold, see :mod:`memq.core.identity`), and an id route parameter
(``{user_id:memqid}``) is one segment whose separators become ``/`` again. The rule: an id goes
in a path percent-encoded as one segment (``quote(id, safe="")``); an unencoded ``/`` separates
segments, never belongs to an id.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from starlette.convertors import Convertor, register_url_convertor
from starlette.types import ASGIApp, Receive, Scope, Send

SEPARATOR = "\x1f"  # never in an id: ids are printable text (memq.core.identity)
ID = "memqid"  # the convertor's name in route templates: "/v1/users/{user_id:memqid}"


class IdConvertor(Convertor[str]):
    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return value.replace(SEPARATOR, "/")

    def to_string(self, value: str) -> str:
        return path_segment(value)


# Route templates are compiled when the route modules are imported: the convertor must be known
# by then. Registering a name is all it does (Starlette's registry is keyed by name).
register_url_convertor(ID, IdConvertor())


def path_segment(value: str) -> str:
    """An id as one path segment: percent-encoded, dots too when the id is only dots (a client
    would otherwise resolve ``.`` and ``..`` as relative steps)."""
    if value.strip(".") == "":
        return "%2E" * len(value)
    return quote(value, safe="")


def routing_path(raw_path: str) -> str:
    """The path to route on: each segment of the raw path decoded on its own, a ``/`` decoded
    inside a segment kept as :data:`SEPARATOR`."""
    return "/".join(unquote(segment).replace("/", SEPARATOR) for segment in raw_path.split("/"))


class RawPathRouting:
    """Replace ``scope["path"]`` with :func:`routing_path` of the raw path before routing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] in ("http", "websocket") else None
        if raw:
            text = raw.decode("latin-1")
            decoded = unquote(text)
            path = str(scope["path"])
            if path.endswith(decoded) and "%2f" in text.lower():
                prefix = path[: len(path) - len(decoded)]  # a root path put before it
                scope = {**scope, "path": prefix + routing_path(text)}
        await self.app(scope, receive, send)
