"""`memq serve`: the HTTP API (FastAPI on uvicorn) and the MCP server over memq's public API.

``create_app(settings)`` builds the app; :mod:`memq.server.auth` holds keys, scopes and user-id
prefixes; the routes are grouped by area (``routes_agent``, ``routes_admin``, ``routes_ops``);
``mcp_tools`` holds the MCP tools served over stdio (`memq mcp`) and at ``/mcp``.
"""

from __future__ import annotations

from memq.server.app import create_app

__all__ = ["create_app"]
