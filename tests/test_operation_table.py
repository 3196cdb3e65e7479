"""The one table of operations, swept at every door: each HTTP route and each MCP tool names an
operation of ``memq.operations.table``, and a caller the table refuses is refused there — by a
real `memq serve` (uvicorn) and the MCP SDK's own client — so a new route or tool cannot forget
the check or pick a scope of its own."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from fastapi.routing import APIRoute
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.operations.access import LOCAL, Forbidden, Principal
from memq.operations.table import OPERATIONS, authorize
from memq.server import create_app
from memq.server.auth import Authorize
from memq.server.mcp_tools import RESOURCE_OPERATIONS, TOOL_OPERATIONS, build_mcp
from memq.testing.celery_procs import memq_env
from memq.testing.serve_proc import ServeProcess
from tests.support.serve import Keys, bearer

_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def _operation_of(route: APIRoute) -> str | None:
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        if isinstance(dep.call, Authorize):
            return dep.call.operation
        stack += dep.dependencies
    raise AssertionError(f"{route.path} declares no Authorize(operation)")


def _api_routes() -> list[tuple[str, str, str]]:
    """(method, path, operation) of every keyed route of the app, read from its own table."""
    app = create_app(MemqSettings(), mcp=False)
    out = []
    for route in app.routes:
        if isinstance(route, APIRoute):
            op = _operation_of(route)
            if op is not None:
                out += [(m, route.path, op) for m in sorted(route.methods)]
    return out


def test_every_keyed_route_names_an_operation_of_the_table() -> None:
    routes = _api_routes()
    assert routes, "no route found"
    assert {op for _, _, op in routes} - set(OPERATIONS) == set()


def test_every_tool_and_resource_names_an_operation_of_the_table() -> None:
    mcp = build_mcp(None, lambda _ctx: None)  # type: ignore[arg-type]
    tools = {tool.name for tool in anyio.run(mcp.list_tools)}
    assert tools == set(TOOL_OPERATIONS)
    templates = {t.uri_template for t in anyio.run(mcp.list_resource_templates)}
    assert templates == set(RESOURCE_OPERATIONS)
    assert set(TOOL_OPERATIONS.values()) | set(RESOURCE_OPERATIONS.values()) <= set(OPERATIONS)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_the_table_refuses_what_it_says(name: str) -> None:
    op = OPERATIONS[name]
    agent = Principal("agents", frozenset({"agent"}))
    bound = Principal("app1", frozenset({"agent", "admin"}), "app1-")
    user = "app2-x" if op.span == "user" else None
    if op.scope == "admin":
        with pytest.raises(Forbidden, match="'admin' scope"):
            authorize(agent, name, user)
    else:
        assert authorize(agent, name, user) is op
    if op.span in ("user", "every_user"):
        with pytest.raises(Forbidden, match="app1-"):
            authorize(bound, name, user)
    assert authorize(LOCAL, name, user) is op


@pytest.fixture(scope="module")
def server(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    tmp: Path = tmp_path_factory.mktemp("operation-table")
    settings = MemqSettings(
        redis_url=redis_server.url,
        key_prefix=f"t{uuid.uuid4().hex[:10]}",
        storage_dir=tmp / "memory",
        data_dir=tmp / "data",
        llm_provider="rules",
    )
    keys_file = tmp / "keys.json"
    keys_file.write_text(Keys().file_text(), encoding="utf-8")
    proc = ServeProcess(
        memq_env(settings, MEMQ_SERVE_API_KEYS_FILE=str(keys_file)), tmp / "serve.log"
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.mark.integration
@pytest.mark.parametrize(("method", "path", "name"), _api_routes(), ids=str)
def test_an_agent_key_gets_exactly_the_routes_the_table_gives_it(
    server: ServeProcess, method: str, path: str, name: str
) -> None:
    url = _PARAM.sub(lambda m: {"user_id": "ann", "fact_id": "fact_00000000"}.get(m[1], "x"), path)
    body: dict[str, Any] | None = {} if method in {"POST", "PUT", "PATCH"} else None
    with httpx.Client(base_url=server.url, timeout=30) as http:
        answer = http.request(method, url, json=body, headers=bearer(Keys().agent))
    if OPERATIONS[name].scope == "admin":
        assert answer.status_code == 403, f"{method} {url}: {answer.text}"
        assert "'admin' scope" in answer.json()["detail"]
    else:
        assert answer.status_code != 403, f"{method} {url}: {answer.text}"


@pytest.mark.integration
def test_an_agent_key_gets_exactly_the_tools_the_table_gives_it(server: ServeProcess) -> None:
    headers = {**bearer(Keys().agent), "X-Memq-User": "ann"}
    arguments = {
        "remember": {"text": "I live in Lisbon."},
        "recall": {"query": "where do I live?"},
        "list_facts": {},
        "edit_fact": {"fact_id": "fact_00000000", "content": "x"},
        "delete_fact": {"fact_id": "fact_00000000"},
    }
    assert set(arguments) == set(TOOL_OPERATIONS)
    outcomes: dict[str, Any] = {}

    async def main() -> None:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(server.url + "/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            for tool, args in arguments.items():
                outcomes[tool] = await session.call_tool(tool, args)

    anyio.run(main)
    for tool, result in outcomes.items():
        text = "".join(getattr(part, "text", "") for part in result.content)
        refused = result.is_error and "'admin' scope" in text
        assert refused == (OPERATIONS[TOOL_OPERATIONS[tool]].scope == "admin"), (tool, text)
