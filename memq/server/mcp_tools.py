"""The MCP server: a few tools over the same memq handles as the HTTP routes, served over stdio
(`memq mcp`, one user per process) and over streamable HTTP at ``/mcp`` (the user comes from the
``X-Memq-User`` header, checked against the API key like any route).

Few tools, plainly named: each costs the client's context window, and a model should pick the
right one from its name and first sentence. The user is never a tool argument: a model talked
into another user id must not reach another user's memory.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import unquote

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import Field
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from memq.core.connection import REDIS_ERRORS
from memq.core.errors import InvalidIdentifier, MemqError
from memq.core.identity import validate_agent_name
from memq.core.settings import MemqSettings
from memq.core.timestamps import timestamp_ms
from memq.operations.access import LOCAL, Forbidden, Principal
from memq.operations.refusals import reason, status_of
from memq.operations.service import MemqService
from memq.server.auth import Keyring, bearer_token
from memq.server.models import TOKEN_BUDGET
from memq.server.problems import problem

USER_HEADER = "x-memq-user"
AGENT_HEADER = "x-memq-agent"
ANONYMOUS_HEADER = "x-memq-anonymous"
MCP_USER_HINT = (
    "send the X-Memq-User header (the user id, percent-encoded), or X-Memq-Anonymous: true for "
    "the anonymous user"
)
MCP_PATH = "/mcp"
# One thread for every `remember`: its messages accumulate until extracted. Each call's messages
# carry ids of their own, so words remembered again (say, after their fact was deleted) are a new
# turn, extracted again, never merged away as already seen.
REMEMBER_THREAD = "mcp-remember"
_STATE_KEY = "memq_mcp"

# Each tool is one operation of memq.operations.table (its scope and span come from there).
TOOL_OPERATIONS = {
    "remember": "hand_off",
    "recall": "recall",
    "list_facts": "read_memory",
    "edit_fact": "edit_fact",
    "delete_fact": "delete_fact",
}
RESOURCE_OPERATIONS = {"memq://users/{user_id}/memory": "read_memory"}

INSTRUCTIONS = (
    "Long-term memory about the user. Call `recall` with the user's message before answering "
    "to get what is known about them; call `remember` when they tell you something worth "
    "keeping (a preference, a fact about their work or life, a correction)."
)


@dataclass(frozen=True, slots=True)
class Caller:
    principal: Principal
    user_id: str
    agent_name: str | None


CallerOf = Callable[[Context], Caller]


@contextlib.contextmanager
def _as_tool_error(error: type[ToolError | ResourceError] = ToolError) -> Iterator[None]:
    """memq's refusals as the one line the client reads: a ``ToolError`` for a tool, a
    ``ResourceError`` for a resource (the SDK hides any other exception's text behind a generic
    error and logs its traceback; an expected refusal must do neither)."""
    refused: tuple[type[Exception], ...] = (MemqError, *REDIS_ERRORS)
    try:
        yield
    except refused as exc:
        raise error(reason(exc)) from exc


def memq_version() -> str:
    """The installed memq's version (what MCP clients are told the server is)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memq")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def build_mcp(service: MemqService, caller_of: CallerOf) -> MCPServer:
    # Warnings only: the SDK logs each tool error at INFO, and a refusal may name what was sent.
    mcp = MCPServer(
        name="memq", version=memq_version(), instructions=INSTRUCTIONS, log_level="WARNING"
    )

    @mcp.tool()
    def remember(text: str, ctx: Context, said_at: str | None = None) -> str:
        """Remember something the user said about themselves (extracted into facts within
        seconds). Pass their own words; one topic per call is best. `said_at`: when they said
        it (ISO 8601), if not just now."""
        with _as_tool_error():
            caller = caller_of(ctx)
            said: dict[str, str] = {} if said_at is None else {"created_at": said_at}
            turn = uuid.uuid4().hex
            messages = [
                {"role": "user", "content": text, "id": f"mcp-{turn}-u", **said},
                {
                    "role": "assistant",
                    "content": "I will remember that.",
                    "id": f"mcp-{turn}-a",
                    **said,
                },
            ]
            outcome = service.hand_off(
                caller.principal,
                caller.user_id,
                caller.agent_name,
                REMEMBER_THREAD,
                messages,
                flush=True,
            )
            if outcome.status == "nothing_to_remember":
                return "nothing to remember in that text"
            # Never refused for its time: an unreadable one is the time of this call (counted).
            late = (
                ""
                if said_at is None or timestamp_ms(said_at) is not None
                else (" (said_at is no ISO 8601 time: the time of this call stands in)")
            )
            if outcome.status == "spooled" and outcome.durable:
                return (
                    "will be remembered (memq's store is unavailable; kept on disk and sent "
                    "when it is back)" + late
                )
            if outcome.status == "spooled":
                return (
                    "will be remembered if this server runs until memq's store is back (kept in "
                    "its memory only)" + late
                )
            return "will be remembered" + late

    @mcp.tool()
    def recall(
        query: str,
        ctx: Context,
        max_tokens: Annotated[
            int | None, Field(ge=TOKEN_BUDGET["ge"], le=TOKEN_BUDGET["le"])
        ] = None,
    ) -> str:
        """What is known about the user that is relevant to `query` (their latest message):
        a <user_memory> block to read before answering; empty when nothing is known."""
        with _as_tool_error():
            caller = caller_of(ctx)
            return service.recall(
                caller.principal,
                caller.user_id,
                caller.agent_name,
                query=query or None,
                max_tokens=max_tokens,
                strict=True,  # an outage is an error here, not "nothing known"
            )

    @mcp.tool()
    def list_facts(ctx: Context, category: str | None = None) -> list[dict[str, Any]]:
        """Every stored fact about the user (id, content, category, confidence), most confident
        first; use the ids with edit_fact and delete_fact."""
        with _as_tool_error():
            caller = caller_of(ctx)
            facts = service.list_facts(
                caller.principal, caller.user_id, caller.agent_name, category=category
            )
            return [
                {
                    "id": f.id,
                    "content": f.content,
                    "category": f.category,
                    "confidence": f.confidence,
                }
                for f in facts
            ]

    @mcp.tool()
    def edit_fact(
        fact_id: str,
        ctx: Context,
        content: str | None = None,
        category: str | None = None,
        confidence: float | None = None,
    ) -> dict[str, Any]:
        """Correct a stored fact (only the fields given change), when the user says it is
        wrong or out of date."""
        with _as_tool_error():
            caller = caller_of(ctx)
            fact = service.edit_fact(
                caller.principal,
                caller.user_id,
                caller.agent_name,
                fact_id,
                content=content,
                category=category,
                confidence=confidence,
            )
            return {"id": fact.id, "content": fact.content, "category": fact.category}

    @mcp.tool()
    def delete_fact(fact_id: str, ctx: Context) -> str:
        """Delete a stored fact, when the user asks to forget it."""
        with _as_tool_error():
            caller = caller_of(ctx)
            fact = service.delete_fact(caller.principal, caller.user_id, caller.agent_name, fact_id)
            return f"deleted {fact.id}"

    @mcp.resource("memq://users/{user_id}/memory", mime_type="application/json")
    def memory_document(user_id: str, ctx: Context) -> str:
        """The user's whole memory document (memq memory.json); only the connection's user, its
        id percent-encoded as one segment (``memq://users/slack%2FC1/memory``)."""
        with _as_tool_error(ResourceError):
            caller = caller_of(ctx)
            try:
                named = unquote(user_id, errors="strict")
            except UnicodeDecodeError:
                raise InvalidIdentifier(
                    "the user id in the URI is not percent-encoded UTF-8"
                ) from None
            if named != caller.user_id:
                raise Forbidden("this connection reads only its own user's memory")
            document = service.document(caller.principal, caller.user_id, caller.agent_name)
            return json.dumps(document.to_json(), ensure_ascii=False)

    return mcp


# --- stdio: one user per process, the local user's own trust
async def run_stdio(settings: MemqSettings, user_id: str, agent_name: str | None) -> None:
    # The client may end this process any time: a turn is kept only on disk, or refused.
    service = MemqService(settings, keep_in_memory=False)
    caller = Caller(LOCAL, user_id, agent_name)
    try:
        await build_mcp(service, lambda _ctx: caller).run_stdio_async()
    finally:
        service.close()


# --- streamable HTTP at /mcp
def _http_caller(ctx: Context) -> Caller:
    request = ctx.request_context.request
    state = getattr(request, "scope", {}).get("state", {}) if request is not None else {}
    caller = state.get(_STATE_KEY)
    if not isinstance(caller, Caller):  # only the key guard puts it there
        raise Forbidden("no caller identity on this MCP request")
    return caller


class KeyGuard:
    """The ``/mcp`` endpoint behind the same keys as every route: resolve the key, require
    ``agent``, bind the user from ``X-Memq-User`` (checked against the key's prefix)."""

    # The access log's name for every call here (it logs route templates, and this route is a
    # plain Starlette one, which leaves no route in the scope).
    template = MCP_PATH

    def __init__(self, app: Any, keyring: Keyring) -> None:
        self.app = app
        self.keyring = keyring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") == "GET":
            # The stream of server-initiated messages: a stateless server sends none, and an
            # open GET would be held forever. 405 is the spec's answer for "no such stream".
            response = problem(405, "this MCP server offers no GET stream; POST requests")
            response.headers["Allow"] = "POST, DELETE"
            await response(scope, receive, send)
            return
        request = Request(scope)
        try:
            caller = self.authorize(request)
        except MemqError as exc:
            await problem(status_of(exc), str(exc))(scope, receive, send)
            return
        scope.setdefault("state", {})[_STATE_KEY] = caller
        await self.app(scope, receive, send)

    def authorize(self, request: Request) -> Caller:
        principal = self.keyring.resolve(bearer_token(request.headers.get("authorization")))
        principal.require_scope("agent")
        user = _named_user(request, principal)
        principal.require_user(user)
        agent = validate_agent_name(_header_id(request, AGENT_HEADER))
        return Caller(principal, user, agent)


def _named_user(request: Request, principal: Principal) -> str:
    """The user a request names: its ``X-Memq-User``; the anonymous user only when asked for with
    ``X-Memq-Anonymous: true``; the key's own user when the key is bound to exactly one. Never a
    default: a request that names no user is refused, naming the header."""
    from memq.core.identity import ANONYMOUS_USER_ID, validate_named_user

    named = _header_id(request, USER_HEADER)
    anonymous = request.headers.get(ANONYMOUS_HEADER, "").strip().lower() in ("1", "true", "yes")
    if anonymous and named is None:
        return ANONYMOUS_USER_ID
    if named is None and principal.user_id is not None:
        return principal.user_id
    return validate_named_user(named, ask=MCP_USER_HINT)


def _header_id(request: Request, name: str) -> str | None:
    """An id from a header, percent-decoded (headers carry ASCII; `j%C3%BCrgen`, `a%25b`)."""
    value = request.headers.get(name)
    if not value:
        return None
    try:
        return unquote(value, errors="strict")
    except UnicodeDecodeError:
        raise InvalidIdentifier(f"{name}: not percent-encoded UTF-8") from None


class HttpMcp:
    """The MCP endpoint of one app: its route and the lifespan its session manager needs."""

    def __init__(self, service: MemqService, settings: MemqSettings) -> None:
        self.server = build_mcp(service, _http_caller)
        # Stateless JSON responses: any replica answers any request, no session to pin.
        starlette_app = self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            json_response=True,
            max_request_body_size=settings.serve_max_body_bytes,
            host=settings.serve_host,
            # The app's own Host rule (memq/server/hosts.py), not the SDK's loopback default.
            transport_security=_transport_security(settings),
        )
        self._routes = [r for r in starlette_app.routes if isinstance(r, Route)]

    def route(self, keyring: Keyring) -> Route:
        (inner,) = [r for r in self._routes if r.path == MCP_PATH]
        return Route(MCP_PATH, endpoint=KeyGuard(inner.endpoint, keyring))

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        async with self.server.session_manager.run():
            yield


def _transport_security(settings: MemqSettings) -> TransportSecuritySettings:
    from memq.server.hosts import allowed_hosts

    hosts = allowed_hosts(settings)
    if hosts is None:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return hosts.transport_security()


def build_http_mcp(service: MemqService, settings: MemqSettings) -> HttpMcp:
    return HttpMcp(service, settings)
