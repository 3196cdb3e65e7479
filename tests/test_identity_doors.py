"""No silent default for identity, on a real `memq serve`: an MCP request that names no user is
refused with a line naming the header (whatever key it carries), unless its key is bound to
exactly one user; the anonymous user is reached only by asking for it (`X-Memq-Anonymous`), never
through `/v1/users/%00anonymous`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from memq.core.identity import ANONYMOUS_USER_ID
from memq.core.settings import MemqSettings
from memq.testing.celery_procs import REPO_ROOT
from storage import get_storage
from storage.management import MemoryManager
from tests.support.serve import Keys, bearer

pytestmark = [pytest.mark.integration]

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def _facts_over_mcp(url: str, headers: dict[str, str]) -> list[str]:
    async def main() -> list[str]:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(url + "/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.call_tool("list_facts", {})
            assert not listed.is_error, listed
            rows = (listed.structured_content or {}).get("result")
            if rows is None:
                rows = json.loads("".join(getattr(p, "text", "") for p in listed.content))
            return [row["content"] for row in rows]

    out: list[list[str]] = []

    async def wrapper() -> None:
        out.append(await main())

    anyio.run(wrapper)
    return out[0]


def test_a_request_that_names_no_user_is_refused_naming_the_header(
    settings: MemqSettings, serve_for: Any, api_keys: tuple[Keys, Any]
) -> None:
    manager = MemoryManager(get_storage(settings))
    manager.add_fact(ANONYMOUS_USER_ID, "Anonymous likes jazz")
    manager.add_fact("dora", "Dora likes tea")
    keys, path = api_keys
    server = serve_for(settings)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for key in (keys.agent, keys.app1_agent):  # unbound, and bound to a prefix
            refused = http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **bearer(key)})
            assert refused.status_code == 422, refused.text
            assert "X-Memq-User" in refused.json()["detail"]
        # HTTP never reaches the anonymous user by its internal id.
        for route in ("/v1/users/%00anonymous/memory", "/v1/users/%00anonymous/facts"):
            hidden = http.get(route, headers=bearer(keys.admin))
            assert hidden.status_code == 422, hidden.text
            assert "jazz" not in hidden.text

    # Asking for the anonymous user explicitly reaches it.
    anonymous = {**bearer(keys.agent), "X-Memq-Anonymous": "true"}
    assert _facts_over_mcp(server.url, anonymous) == ["Anonymous likes jazz"]

    # A key bound to exactly one user means that user when the request names none.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(PYTHONPATH=str(REPO_ROOT), MEMQ_SERVE_API_KEYS_FILE=str(path))
    issued = subprocess.run(
        [
            *(sys.executable, "-m", "memq.cli", "api-key", "new", "dora-desk"),
            *("--scope", "agent", "--user", "dora"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert issued.returncode == 0, issued.stderr
    dora_key = issued.stdout.strip()
    assert _facts_over_mcp(server.url, bearer(dora_key)) == ["Dora likes tea"]
    other = httpx.post(
        server.url + "/mcp",
        json=INITIALIZE,
        headers={**MCP_HEADERS, **bearer(dora_key), "X-Memq-User": "erin"},
        timeout=30,
    )
    assert other.status_code == 403
