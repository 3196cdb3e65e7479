"""MCP with the SDK's own client: over stdio (spawning `memq mcp`) and over streamable HTTP at
`/mcp` on a real `memq serve`. Each lists the tools, remembers a fact through a real worker and
recalls it."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from memq.core.settings import MemqSettings
from memq.testing.celery_procs import REPO_ROOT
from memq.testing.waiting import DEADLINE_SECONDS
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import fact_for, learn_items, stack_settings
from tests.support.serve import Keys, bearer

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TOOLS = {"remember", "recall", "list_facts", "edit_fact", "delete_fact"}


def _text(result: Any) -> str:
    assert not result.is_error, result
    return "".join(getattr(part, "text", "") for part in result.content)


async def remember_then_recall(
    session: ClientSession, item: str, said_at: str | None = None, reply: str = "will be remembered"
) -> dict[str, Any]:
    await session.initialize()
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert set(tools) == TOOLS
    assert all(tool.description for tool in tools.values())
    assert "user_id" not in json.dumps([t.input_schema for t in tools.values()])

    when = {} if said_at is None else {"said_at": said_at}
    said = await session.call_tool(
        "remember", {"text": f"Please remember that I own {item}.", **when}
    )
    assert _text(said) == reply

    recalled = ""
    with anyio.fail_after(DEADLINE_SECONDS):
        while fact_for(item) not in recalled:
            recalled = _text(await session.call_tool("recall", {"query": "what do I own?"}))
            if fact_for(item) not in recalled:
                await anyio.sleep(0.2)  # wait-ok: polling the worker's result under a deadline
    listed = await session.call_tool("list_facts", {})
    assert not listed.is_error, listed
    # The structured result when the SDK gives one, else one JSON text part per fact.
    if listed.structured_content is not None:
        facts = listed.structured_content["result"]
    else:
        facts = [json.loads(part.text) for part in listed.content]
    assert [fact["content"] for fact in facts] == [fact_for(item)]
    assert all(fact["id"].startswith("fact_") for fact in facts)
    return {"recalled": recalled, "facts": facts}


def _stack(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs
) -> MemqSettings:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(make_settings, openai_server)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    return settings


def _run(main: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    result: dict[str, Any] = {}

    async def wrapper() -> None:
        result.update(await main())

    anyio.run(wrapper)
    return result


def test_mcp_over_stdio_remembers_through_a_worker_and_recalls(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs
) -> None:
    settings = _stack(make_settings, openai_server, celery_procs)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(memq_env(settings))
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memq.cli", "mcp", "--user", "frank", "--agent", "desk"],
        env=env,
        cwd=str(REPO_ROOT),
    )

    async def main() -> dict[str, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            out = await remember_then_recall(session, "item-5", said_at="2023-05-08T13:56:00Z")
            document = await session.read_resource("memq://users/frank/memory")
            out["document"] = json.loads(document.contents[0].text)  # type: ignore[union-attr]
            return out

    out = _run(main)
    assert out["recalled"].startswith("<user_memory>")
    assert [f["content"] for f in out["document"]["facts"]] == [fact_for("item-5")]
    assert out["document"]["facts"][0]["said_at"] == "2023-05-08T13:56:00Z"
    assert "8 May 2023:" in out["recalled"]


def test_mcp_over_streamable_http_with_a_key_remembers_and_recalls(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    serve_for: Any,
) -> None:
    settings = _stack(make_settings, openai_server, celery_procs)
    server = serve_for(settings)
    headers = {**bearer(Keys().app1_agent), "X-Memq-User": "app1-gina"}

    async def main() -> dict[str, Any]:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(server.url + "/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            # A time that is none is no refusal: the call's own time stands in, and it says so.
            out = await remember_then_recall(
                session,
                "item-6",
                said_at="99999-01-01",
                reply="will be remembered (said_at is no ISO 8601 time: the time of this call "
                "stands in)",
            )
            # An agent key may not delete: the tool says so, nothing changes.
            refused = await session.call_tool("delete_fact", {"fact_id": "fact_00000000"})
            out["refused"] = refused
            return out

    out = _run(main)
    assert fact_for("item-6") in out["recalled"]
    assert out["refused"].is_error
    assert "'admin' scope" in _text_any(out["refused"])
    assert Keys().app1_agent not in server.log_text()


def _text_any(result: Any) -> str:
    return "".join(getattr(part, "text", "") for part in result.content)
