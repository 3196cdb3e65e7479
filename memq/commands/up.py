"""`memq up`: the whole local stack as one supervised foreground process."""

from __future__ import annotations

import argparse

from memq.commands.common import CommandContext, mask_url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "up",
        help="run Redis (unless MEMQ_REDIS_URL is set), a worker, beat and Flower until Ctrl-C",
        description=(
            "Run the local stack in the foreground: a private redis-server with AOF in the data "
            "folder (unless MEMQ_REDIS_URL is set), a Celery worker, beat (the ticker) and Flower "
            "with basic auth on 127.0.0.1. Ctrl-C or SIGTERM stops everything; if one process "
            "dies, the others are stopped and the exit code is non-zero."
        ),
    )
    parser.add_argument("--no-flower", action="store_true", help="do not start Flower")
    parser.add_argument("--no-beat", action="store_true", help="do not start beat (the ticker)")
    parser.add_argument("--loglevel", default="INFO", help="log level of the Celery processes")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from memq.stack import Stack, StackOptions, uses_private_redis

    settings = context.settings
    if not uses_private_redis(settings):
        settings.broker  # noqa: B018 - a cluster without MEMQ_BROKER_URL: one line, before any child
    options = StackOptions(flower=not args.no_flower, beat=not args.no_beat, loglevel=args.loglevel)
    stack = Stack(settings, options).start()
    where = "private redis-server, AOF in " + str(settings.data_dir / "redis")
    if not uses_private_redis(settings):
        where = "from MEMQ_REDIS_URL"
    where_memory = settings.storage_dir if settings.storage == "file" else "in Redis"
    lines = [
        f"memq up: Redis {mask_url(stack.redis_url)} ({where})",
        f"  storage: {settings.storage} ({where_memory})",
        f"  extractor: {_extractor(settings.resolved_llm_provider, settings.llm_model)}",
    ]
    if options.flower:
        lines.append(f"  Flower: {stack.flower_url}  user {settings.flower_user}")
        if settings.flower_password is None:
            # Generated for this run only and shown once; set MEMQ_FLOWER_PASSWORD to fix it.
            lines.append(f"  Flower password (generated, shown once): {stack.flower_password}")
    if uses_private_redis(settings) and stack.redis_url != settings.redis_url:
        # The default port was taken: agents must be told where this Redis is.
        lines.append(f"  agents: export MEMQ_REDIS_URL={stack.redis_url}")
    lines.append("  Ctrl-C stops everything.")
    print("\n".join(lines), flush=True)
    return stack.supervise()


def _extractor(provider: str, model: str) -> str:
    if provider == "rules":
        return "offline rules extractor (set MEMQ_LLM_BASE_URL or OPENAI_API_KEY for a real model)"
    return f"LLM {model}"
