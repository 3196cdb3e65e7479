"""`memq serve`'s doors against outsiders and slow clients, on a real uvicorn process: the Host
check (DNS rebinding) on /v1, /ui and /mcp, a deadline on request heads, no endless GET /mcp
stream, API keys that take effect without a restart, and MCP that names its version and shows
in the access log."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from memq.core.settings import MemqSettings
from memq.server.mcp_tools import memq_version
from memq.testing.celery_procs import REPO_ROOT
from tests.support.serve import Keys, bearer
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration]

FOREIGN = "rebind.attacker.example"


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_an_open_server_answers_421_to_a_foreign_host_on_every_door(
    settings: MemqSettings, serve_for: Any
) -> None:
    server = serve_for(settings, keys=False)  # the default of `memq serve`: open on loopback
    port = _port(server.url)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        for path in ("/v1/users/alice/memory", "/ui/", "/v1/queue/stats"):
            foreign = http.get(path, headers={"Host": f"{FOREIGN}:{port}"})
            assert foreign.status_code == 421, path
            assert FOREIGN not in foreign.text
            own = http.get(path, headers={"Host": f"127.0.0.1:{port}"})
            assert own.status_code != 421, path
            assert http.get(path, headers={"Host": f"localhost:{port}"}).status_code != 421
        forged = http.post(
            "/v1/users/alice/conversations",
            json={"thread_id": "t", "messages": []},
            headers={"Host": FOREIGN},
        )
        assert forged.status_code == 421
        mcp = http.post("/mcp", json={}, headers={"Host": f"{FOREIGN}:{port}"})
        assert mcp.status_code == 421
        # Probes carry whatever Host a load balancer sends.
        assert http.get("/healthz", headers={"Host": FOREIGN}).status_code == 200


def test_a_configured_host_name_is_answered(settings: MemqSettings, serve_for: Any) -> None:
    server = serve_for(settings, keys=False, MEMQ_SERVE_ALLOWED_HOSTS="memq.internal")
    with httpx.Client(base_url=server.url, timeout=10) as http:
        assert http.get("/v1/queue/stats", headers={"Host": "memq.internal"}).status_code == 200
        assert http.get("/v1/queue/stats", headers={"Host": FOREIGN}).status_code == 421


def _unfinished_heads(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # never ends
        sockets.append(sock)
    return sockets


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_connections_that_never_finish_their_headers_are_closed(
    settings: MemqSettings, serve_for: Any
) -> None:
    server = serve_for(settings, keys=False, MEMQ_SERVE_HEADER_TIMEOUT_SECONDS="2")
    slow = _unfinished_heads(_port(server.url), 300)
    try:
        # The server still answers while they hang ...
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
        # ... and closes every one of them once its deadline passes.
        started = time.monotonic()
        assert all(_closed_by_server(sock) for sock in slow)
        assert time.monotonic() - started < 30
    finally:
        for sock in slow:
            sock.close()
    # A request whose head arrives in time is served on the same kind of connection.
    with socket.create_connection(("127.0.0.1", _port(server.url)), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")


def test_get_mcp_is_refused_at_once_instead_of_held_open(
    settings: MemqSettings, serve_for: Any
) -> None:
    server = serve_for(settings, keys=False)
    answer = httpx.get(
        server.url + "/mcp",
        headers={"Accept": "text/event-stream", "X-Memq-User": "alice"},
        timeout=10,
    )
    assert answer.status_code == 405
    assert "POST" in answer.headers["allow"]


def test_a_key_added_with_api_key_new_works_without_a_restart(
    settings: MemqSettings, serve_for: Any, api_keys: tuple[Keys, Any]
) -> None:
    _, path = api_keys
    server = serve_for(settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(PYTHONPATH=str(REPO_ROOT), MEMQ_SERVE_API_KEYS_FILE=str(path))
    issued = subprocess.run(
        [sys.executable, "-m", "memq.cli", "api-key", "new", "late", "--scope", "admin"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    key = issued.stdout.strip()
    assert "from its next request" in issued.stderr
    answer = httpx.get(server.url + "/v1/queue/stats", headers=bearer(key), timeout=10)
    assert answer.status_code == 200, answer.text
    assert key not in server.log_text()


def test_mcp_names_memq_version_and_the_access_log_names_mcp_calls(
    settings: MemqSettings, serve_for: Any
) -> None:
    server = serve_for(settings)
    headers = {**bearer(Keys().agent), "X-Memq-User": "alice"}

    async def main() -> str:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(server.url + "/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            result = await session.initialize()
            return str(result.server_info.version)

    versions: list[str] = []

    async def wrapper() -> None:
        versions.append(await main())

    anyio.run(wrapper)
    assert versions == [memq_version()] and versions[0]
    wait_for(lambda: "POST /mcp 200" in server.log_text(), what="the access line")
    assert "(no route)" not in server.log_text()
