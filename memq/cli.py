"""The `memq` command line: run, watch and repair memq.

Every failure an operator can cause (bad input, unknown user, Redis down) is one line on stderr
and a non-zero exit code; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from memq.commands import config, doctor, exporter, memory, queue, reembed, serve, up, why
from memq.commands import demo as demo_command
from memq.commands import eval as eval_command
from memq.commands.common import CommandContext, resolve_user, shown
from memq.core.connection import REDIS_ERRORS, UNREACHABLE_ERRORS
from memq.core.errors import ConfigError, MemqError
from memq.core.redis_urls import mask_url

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memq",
        description="Long-term user memory for LLM agents, extracted by Celery workers over Redis.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (
        up,
        demo_command,
        queue,
        memory,
        why,
        doctor,
        config,
        exporter,
        eval_command,
        serve,
        reembed,
    ):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    context = CommandContext()
    try:
        resolve_user(args)
        return int(args.run(args, context))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            raise
        print(f"memq {args.command}: {shown(_explain(exc, context))}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        context.close()


def _explain(exc: Exception, context: CommandContext) -> str:
    """One line that says what went wrong, never a password, never a traceback."""
    if isinstance(exc, UNREACHABLE_ERRORS):
        return f"cannot reach Redis at {_redis_url(context)} ({_first_line(exc)})"
    if isinstance(exc, ConfigError):  # pydantic lists each bad field on its own line
        return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if isinstance(exc, MemqError):
        return _first_line(exc)
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename}"
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
    if isinstance(exc, REDIS_ERRORS):
        return f"Redis error at {_redis_url(context)}: {_first_line(exc)}"
    return f"unexpected {type(exc).__name__}: {_first_line(exc)} (run with --debug for details)"


def _redis_url(context: CommandContext) -> str:
    try:
        return mask_url(context.settings.redis_url)
    except MemqError:
        return "<unknown>"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
