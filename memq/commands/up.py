"""`memq up`: the whole local stack as one supervised foreground process."""

from __future__ import annotations

import argparse
import shlex

from memq.commands.common import CommandContext
from memq.core.redis_urls import mask_url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "up",
        help=(
            "run Redis (unless MEMQ_REDIS_URL is set), a worker, beat, Flower, the exporter "
            "and memq serve until Ctrl-C"
        ),
        description=(
            "Run the local stack in the foreground: a private redis-server with AOF in the data "
            "folder (unless MEMQ_REDIS_URL is set), a Celery worker, beat (the ticker), Flower "
            "with basic auth on 127.0.0.1, the Prometheus exporter and memq serve (HTTP API and "
            "MCP). A process that dies is restarted (with back-off); one "
            "that keeps crashing stops the stack with a non-zero exit. Ctrl-C or SIGTERM stops "
            "everything, Redis last."
        ),
    )
    parser.add_argument("--no-flower", action="store_true", help="do not start Flower")
    parser.add_argument("--no-beat", action="store_true", help="do not start beat (the ticker)")
    parser.add_argument(
        "--no-exporter", action="store_true", help="do not start the Prometheus exporter"
    )
    parser.add_argument(
        "--no-serve", action="store_true", help="do not start `memq serve` (HTTP API and MCP)"
    )
    parser.add_argument("--loglevel", default="INFO", help="log level of the Celery processes")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from memq.local.options import StackOptions
    from memq.local.stack import Stack, uses_private_redis
    from storage.backends import backend_for

    settings = context.settings
    if not uses_private_redis(settings):
        settings.broker  # noqa: B018 - a cluster without MEMQ_BROKER_URL: one line, before any child
    options = StackOptions(
        flower=not args.no_flower,
        beat=not args.no_beat,
        exporter=not args.no_exporter,
        serve=not args.no_serve,
        loglevel=args.loglevel,
    )
    if options.serve:
        from memq.server.auth import Keyring, check_bind

        # A bind `memq serve` would refuse: one line now, not a child that keeps crashing.
        check_bind(settings.serve_host, Keyring.from_settings(settings))
    stack = Stack(settings, options).start()
    where = "private redis-server, AOF in " + str(settings.data_dir / "redis")
    if not uses_private_redis(settings):
        where = "from MEMQ_REDIS_URL"
    where_memory = backend_for(settings).where(settings)
    lines = [
        f"memq up: Redis {mask_url(stack.agent_url)} ({where})",
        f"  storage: {settings.storage} ({where_memory})",
        f"  extractor: {_extractor(settings.resolved_llm_provider, settings.llm_model)}",
    ]
    if options.serve:
        host = settings.serve_host
        shown = f"[{host}]" if ":" in host else host
        lines.append(f"  HTTP API and MCP: http://{shown}:{settings.serve_port} (memq serve)")
    if options.flower:
        lines.append(f"  Flower: {stack.flower_url}  user {settings.flower_user}")
        if settings.flower_password is None:
            # Generated for this run only and shown once; set MEMQ_FLOWER_PASSWORD to fix it.
            lines.append(f"  Flower password (generated, shown once): {stack.flower_password}")
    if stack.redis_password_file is not None and stack.redis_server is not None:
        # The private Redis wants its password: agents read it from the 0600 file, so the
        # line can be pasted into a shell without the secret landing in the scrollback.
        secret = f"$(cat {shlex.quote(str(stack.redis_password_file))})"
        url = f"redis://:{secret}@127.0.0.1:{stack.redis_server.port}/0"
        lines.append(f'  agents: export MEMQ_REDIS_URL="{url}"')
    lines.append("  Ctrl-C stops everything.")
    print("\n".join(lines), flush=True)
    return stack.supervise()


def _extractor(provider: str, model: str) -> str:
    if provider == "rules":
        return "offline rules extractor (set MEMQ_LLM_BASE_URL or OPENAI_API_KEY for a real model)"
    return f"LLM {model}"
