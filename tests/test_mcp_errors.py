"""MCP errors keep their reason and leak nothing, through the SDK's stdio client: a refused
resource read reaches the client as memq's one line (not a generic -32603), with no traceback
and no id in the server's log; and a text remembered again after its fact was deleted is
learnt again, so "will be remembered" stays true. A real worker extracts."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from memq.testing.celery_procs import REPO_ROOT
from tests.support.celery_procs import CeleryProcs, memq_env

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SAID = "I prefer window seats on long flights."
FACT = "User prefers window seats on long flights"


def _text(result: Any) -> str:
    return "".join(getattr(part, "text", "") for part in result.content)


def test_refusals_keep_their_reason_and_a_text_remembered_again_is_learnt_again(
    make_settings: Any, celery_procs: CeleryProcs, tmp_path: Path
) -> None:
    settings = make_settings(llm_provider="rules", debounce_seconds=0.0, tick_seconds=0.2)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memq.cli", "mcp", "--user", "frank@example.com"],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT), **env},
        cwd=str(tmp_path),
    )
    errlog = (tmp_path / "mcp-stderr.log").open("w")

    async def until_fact(session: ClientSession, present: bool) -> list[dict[str, Any]]:
        with anyio.fail_after(60):
            while True:
                listed = await session.call_tool("list_facts", {})
                facts = listed.structured_content or {}
                rows = facts.get("result", json.loads(_text(listed) or "[]"))
                if any(row["content"] == FACT for row in rows) == present:
                    return list(rows)
                await anyio.sleep(0.2)  # wait-ok: polling the worker's result under a deadline

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            try:
                await session.read_resource("memq://users/ghost%40example.com/memory")
            except MCPError as exc:
                out["refused"] = str(exc)
            out["first"] = _text(await session.call_tool("remember", {"text": SAID}))
            rows = await until_fact(session, present=True)
            (fact,) = [row for row in rows if row["content"] == FACT]
            await session.call_tool("delete_fact", {"fact_id": fact["id"]})
            await until_fact(session, present=False)
            out["again"] = _text(await session.call_tool("remember", {"text": SAID}))
            out["back"] = await until_fact(session, present=True)
        return out

    results: list[dict[str, Any]] = []

    async def wrapper() -> None:
        results.append(await main())

    anyio.run(wrapper)
    errlog.close()
    (out,) = results
    assert out["refused"] == "this connection reads only its own user's memory"
    assert out["first"] == out["again"] == "will be remembered"
    assert [row["content"] for row in out["back"]].count(FACT) == 1
    log = (tmp_path / "mcp-stderr.log").read_text()
    assert "Traceback" not in log
    assert "ghost" not in log and "frank" not in log
