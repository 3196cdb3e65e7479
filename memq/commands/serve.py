"""`memq serve` (HTTP API + MCP at /mcp), `memq mcp` (MCP over stdio), `memq api-key new`."""

from __future__ import annotations

import argparse
import sys

from memq.commands.common import CommandContext, CommandError, add_user_argument


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="the HTTP API and the MCP server (streamable HTTP at /mcp) until Ctrl-C",
        description=(
            "Serve memq over HTTP: versioned JSON endpoints under /v1 (OpenAPI at "
            "/openapi.json), MCP at /mcp, health at /healthz and /readyz. Binds "
            "MEMQ_SERVE_HOST (127.0.0.1 by default); a non-loopback address needs API keys "
            "(MEMQ_SERVE_API_KEYS_FILE or MEMQ_SERVE_API_KEYS). Stateless: run any number."
        ),
    )
    serve.add_argument("--host", default=None, help="bind address (MEMQ_SERVE_HOST)")
    serve.add_argument("--port", type=int, default=None, help="port (MEMQ_SERVE_PORT)")
    serve.add_argument("--no-mcp", action="store_true", help="do not serve MCP at /mcp")
    serve.add_argument("--openapi", action="store_true", help="print the OpenAPI document and exit")
    serve.set_defaults(run=run_serve)

    mcp = sub.add_parser(
        "mcp",
        help="the MCP server over stdio, for desktop clients (Claude Desktop, IDEs)",
        description=(
            "Speak MCP on stdin/stdout for one user: tools to remember, recall, list, edit "
            "and delete facts, and the memory document as a resource. Logs go to stderr."
        ),
    )
    # --user U or --anonymous: never a silent anonymous default for a process serving one user.
    add_user_argument(mcp, option=True)
    mcp.add_argument("--agent", default=None, help="agent name (default: user-global memory)")
    mcp.set_defaults(run=run_mcp)

    key = sub.add_parser("api-key", help="issue an API key for `memq serve`")
    verbs = key.add_subparsers(dest="verb", metavar="ACTION", required=True)
    new = verbs.add_parser(
        "new",
        help="print a new key once, and append its digest to the key file",
        description=(
            "Generate a key. The key is printed once; the key file (MEMQ_SERVE_API_KEYS_FILE "
            "or --file) gets only its SHA-256 digest, its scopes and its user-id prefix."
        ),
    )
    new.add_argument("name", help="a name for the key (logged on refusals, never the key)")
    new.add_argument(
        "--scope", action="append", choices=("agent", "admin"), required=True, dest="scopes"
    )
    bound = new.add_mutually_exclusive_group()
    bound.add_argument("--user-prefix", default=None, help="only user ids starting with this")
    # The user the key is bound to, not a user this command acts on (dest apart from `user`).
    bound.add_argument(
        "--user",
        default=None,
        dest="bound_user",
        help="only this user (MCP requests without X-Memq-User mean it)",
    )
    new.add_argument("--file", default=None, help="key file (default MEMQ_SERVE_API_KEYS_FILE)")
    new.set_defaults(run=run_api_key_new)


def run_serve(args: argparse.Namespace, context: CommandContext) -> int:
    if args.openapi:
        from memq.server.app import openapi_document

        sys.stdout.write(openapi_document())
        return 0
    import logging

    import uvicorn

    from memq.server.app import create_app
    from memq.server.auth import Keyring, check_bind
    from memq.server.slow_clients import header_deadline_protocol

    host = args.host or context.settings.serve_host
    port = context.settings.serve_port if args.port is None else args.port
    # The app (MCP's Host check among others) sees the address actually bound.
    settings = context.settings.model_copy(update={"serve_host": host, "serve_port": port})
    # One line per request: method, route template, status, time (never a path or a body).
    logging.getLogger("memq.server.access").setLevel(logging.INFO)
    keyring = Keyring.from_settings(settings)
    check_bind(host, keyring)
    app = create_app(settings, keyring=keyring, mcp=not args.no_mcp)
    shown = f"[{host}]" if ":" in host else host
    keys = "open (loopback, no API keys)" if keyring.open else f"{len(keyring.by_digest)} API keys"
    print(f"memq serve: http://{shown}:{port} ({keys}); Ctrl-C stops it", flush=True)
    uvicorn.run(
        app,
        host=host,
        port=port,
        # The guard middleware logs route templates only: uvicorn's access log would print
        # paths (user ids) and query strings.
        access_log=False,
        log_level="warning",
        proxy_headers=True,
        forwarded_allow_ips=settings.serve_forwarded_allow_ips,
        server_header=False,
        # Slow clients (memq/server/slow_clients.py): a deadline on each request head, idle
        # connections closed, a ceiling on connections.
        http=header_deadline_protocol(settings.serve_header_timeout_seconds),
        timeout_keep_alive=settings.serve_keep_alive_seconds,
        limit_concurrency=settings.serve_limit_concurrency,
    )
    print("memq serve: stopped", file=sys.stderr)
    return 0


def run_mcp(args: argparse.Namespace, context: CommandContext) -> int:
    import anyio

    from memq.core.identity import validate_agent_name, validate_user_id
    from memq.server.mcp_tools import run_stdio

    user = validate_user_id(args.user)
    agent = validate_agent_name(args.agent)
    anyio.run(run_stdio, context.settings, user, agent)
    return 0


def run_api_key_new(args: argparse.Namespace, context: CommandContext) -> int:
    import json
    from pathlib import Path

    from memq.server.auth import Keyring, key_file_entry, new_key, write_private

    path = Path(args.file) if args.file else context.settings.serve_api_keys_file
    if path is None:
        raise CommandError("api-key new: give --file or set MEMQ_SERVE_API_KEYS_FILE")
    entries: list[object] = []
    if path.exists():
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
        entries = list(data.get("keys", []) if isinstance(data, dict) else data)
    key = new_key()
    entries.append(
        json.loads(key_file_entry(args.name, key, args.scopes, args.user_prefix, args.bound_user))
    )
    Keyring.from_entries(entries)  # a duplicate name or a bad file: refuse before writing
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps({"keys": entries}, indent=2) + "\n")
    print(key)
    print(
        f"memq api-key: {args.name!r} added to {path} (only its digest is stored); a running "
        "`memq serve` that reads this file accepts it from its next request",
        file=sys.stderr,
    )
    return 0
