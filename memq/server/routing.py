"""What every route module shares: its router (stable operation ids, the problem answers in the
OpenAPI document), the handle on the memq service, and the common query parameters."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel

from memq.operations.paging import MAX_LIMIT
from memq.operations.service import MemqService
from memq.server.auth import Authorize
from memq.server.problems import PROBLEM_JSON


class Problem(BaseModel):
    """RFC 9457 problem details: every error answer of the API."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str


# One schema for every error answer, referenced (never inlined): a generated client gets one
# `Problem` type and parses every 4xx/5xx into it. `problem_components` adds it to the document.
PROBLEM_REF = "#/components/schemas/Problem"


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {PROBLEM_JSON: {"schema": {"$ref": PROBLEM_REF}}},
    }


PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: _problem("no API key, or one nobody issued"),
    403: _problem("the key lacks the scope, or the user is outside its user-id prefix"),
    404: _problem("no such fact, thread or dead letter"),
    413: _problem("body or message count above the server's caps"),
    421: _problem("a Host header this server does not answer to (DNS-rebinding protection)"),
    422: _problem("a body, parameter or identifier memq cannot take"),
    500: _problem("an unexpected error (the server log has its type)"),
    503: _problem("Redis does not answer"),
}


def problem_components(schema: dict[str, Any]) -> None:
    """Add the shared ``Problem`` schema to an OpenAPI document (in place)."""
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = Problem.model_json_schema()


def operation_id(route: APIRoute) -> str:
    # Stable, readable ids for generated clients: the handler's name.
    return route.name


def new_router() -> APIRouter:
    return APIRouter(generate_unique_id_function=operation_id, responses=PROBLEMS)


async def service(request: Request) -> MemqService:  # async: no thread-pool hop
    return request.app.state.service  # type: ignore[no-any-return]


Service = Annotated[MemqService, Depends(service)]

AgentName = Annotated[
    str | None,
    # Its alphabet and length are checked where every agent name is (`validate_agent_name`).
    Query(description="agent name; omitted: the user-global memory"),
]


def caller(operation: str) -> Any:
    """A route's caller, checked against the operation table for ``operation``:
    ``who: Annotated[Principal, caller("add_fact")]``."""
    return Depends(Authorize(operation))


Limit = Annotated[
    int,
    Query(ge=1, le=MAX_LIMIT, description=f"items per page (at most {MAX_LIMIT})"),
]
Cursor = Annotated[
    str | None,
    Query(max_length=16, description="`next_cursor` of the previous page; omitted: the first"),
]
