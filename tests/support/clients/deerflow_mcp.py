"""DeerFlow's way into MCP servers, run in an interpreter of its own (langchain-mcp-adapters
needs the MCP SDK 1.x; memq serves with 2.x): read an `extensions_config.json`, replace every value
that is exactly `$NAME` by that environment variable (DeerFlow's `resolve_env_variables`: the
whole value only, unset → ""), turn each enabled server into a langchain-mcp-adapters connection
as DeerFlow does, and call `remember` then `recall` (until `expect` shows, or a deadline) on each.
Prints one JSON object: server name → {"remember": text, "recall": text}. Imports no memq."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from langchain_mcp_adapters.client import MultiServerMCPClient


def resolve(value: Any) -> Any:
    if isinstance(value, str):
        return os.environ.get(value[1:], "") if value.startswith("$") else value
    if isinstance(value, dict):
        return {key: resolve(item) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve(item) for item in value]
    return value


def connection(server: dict[str, Any]) -> dict[str, Any]:
    if server.get("type", "stdio") == "stdio":
        return {
            "transport": "stdio",
            "command": server["command"],
            "args": server.get("args", []),
            "env": server.get("env") or None,
        }
    return {"transport": "streamable_http", "url": server["url"], "headers": server.get("headers")}


def text_of(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in result
        )
    return str(result)


async def main(config_path: str, said: str, expect: str, deadline_seconds: float) -> None:
    with open(config_path, encoding="utf-8") as file:
        servers = resolve(json.load(file))["mcpServers"]
    out: dict[str, dict[str, str]] = {}
    for name, server in servers.items():
        if not server.get("enabled", True):
            continue
        client = MultiServerMCPClient({name: connection(server)})
        tools = {tool.name: tool for tool in await client.get_tools()}
        remembered = text_of(await tools["remember"].ainvoke({"text": said}))
        recalled = ""
        deadline = time.monotonic() + deadline_seconds
        while expect not in recalled and time.monotonic() < deadline:
            recalled = text_of(await tools["recall"].ainvoke({"query": "seats"}))
            if expect not in recalled:
                await asyncio.sleep(0.3)  # wait-ok: polling the worker's result under a deadline
        out[name] = {"remember": remembered, "recall": recalled}
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
