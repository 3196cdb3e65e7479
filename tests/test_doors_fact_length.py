"""One fact length at every door a person types a fact at: with ``MEMQ_FACT_MAX_CHARS=50`` a longer
fact is refused the same way — naming the limit, nothing stored — over HTTP, MCP, the inspector
and the CLI (the server's doors used the default length until every door built its memory
manager the one way, ``memq.operations.service.memory_manager``)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from memq.cli import main
from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.testing.celery_procs import memq_env
from memq.testing.serve_proc import ServeProcess
from storage import get_storage
from tests.support.inspector import UiClient
from tests.support.serve import Keys, bearer

pytestmark = [pytest.mark.integration]

LIMIT = 50
LONG = "I prefer " + "very " * 20 + "long answers."  # over 50 characters
REFUSAL = f"over the limit of {LIMIT} (MEMQ_FACT_MAX_CHARS)"


def _settings(redis_server: RedisServer, tmp: Path) -> MemqSettings:
    return MemqSettings(
        redis_url=redis_server.url,
        key_prefix=f"t{uuid.uuid4().hex[:10]}",
        storage_dir=tmp / "memory",
        data_dir=tmp / "data",
        llm_provider="rules",
        fact_max_chars=LIMIT,
    )


def _contents(settings: MemqSettings, user: str) -> list[str]:
    return [f.content for f in get_storage(settings).load(user, None).facts]


def test_every_door_refuses_a_fact_over_the_configured_length(
    redis_server: RedisServer, tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    settings = _settings(redis_server, tmp_path)
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(Keys().file_text(), encoding="utf-8")
    env = memq_env(settings, MEMQ_SERVE_API_KEYS_FILE=str(keys_file))
    admin = bearer(Keys().admin)
    user = "ann@example.com"
    with ServeProcess(env, tmp_path / "serve.log") as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            # HTTP: refused, and the fact a person can shorten is taken.
            answer = http.post(f"/v1/users/{user}/facts", json={"content": LONG}, headers=admin)
            assert answer.status_code == 422, answer.text
            assert REFUSAL in answer.json()["detail"]
            short = http.post(
                f"/v1/users/{user}/facts", json={"content": "Likes tea."}, headers=admin
            )
            assert short.status_code == 201, short.text
            fact_id = short.json()["id"]

        # MCP: editing the fact to an over-long text is refused with the same line.
        async def edit() -> Any:
            headers = {**admin, "X-Memq-User": user}
            async with (
                httpx2.AsyncClient(headers=headers, timeout=30) as client,
                streamable_http_client(server.url + "/mcp", http_client=client) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return await session.call_tool("edit_fact", {"fact_id": fact_id, "content": LONG})

        result = anyio.run(edit)
        assert result.is_error
        assert REFUSAL in "".join(getattr(p, "text", "") for p in result.content)

        # The inspector: its add form answers the same refusal on an error page.
        ui = UiClient(server.url)
        try:
            assert ui.login(Keys().admin).status_code == 200
            page = ui.post(f"/users/{user.replace('@', '%40')}/facts", {"content": LONG})
            assert page.status_code == 422
            assert REFUSAL in page.text
        finally:
            ui.close()

    # The CLI, with the same settings from the environment.
    for name, value in memq_env(settings).items():
        monkeypatch.setenv(name, value)
    assert main(["facts", "add", user, LONG]) == 1
    assert REFUSAL in capsys.readouterr().err
    assert _contents(settings, user) == ["Likes tea."]
