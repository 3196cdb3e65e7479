"""What every route module shares: its router (stable operation ids, the problem answers in the
OpenAPI document), the handle on the memq service, and the common query parameters."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel

from memq.operations.service import MemqService
from memq.server.auth import Authorize
from memq.server.problems import PROBLEM_JSON


class Problem(BaseModel):
    """RFC 9457 problem details: every error answer of the API."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {PROBLEM_JSON: {"schema": Problem.model_json_schema()}},
    }


PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: _problem("no API key, or one nobody issued"),
    403: _problem("the key lacks the scope, or the user is outside its user-id prefix"),
    413: _problem("body or message count above the server's caps"),
    422: _problem("a body, parameter or identifier memq cannot take"),
    503: _problem("Redis does not answer"),
}


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
