"""`memq exporter`: serve memq's Prometheus metrics, read from Redis on every scrape."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from memq.commands.common import CommandContext
from memq.core.redis_urls import mask_url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "exporter",
        help="serve Prometheus metrics (queue depths, lag, extractions, LLM, ticker heartbeat)",
        description=(
            "Serve /metrics for Prometheus until Ctrl-C or SIGTERM. Every scrape reads the queue "
            "and the counters the workers keep in Redis, so one exporter per deployment is "
            "enough and a restart loses nothing. Binds to MEMQ_EXPORTER_ADDRESS (loopback by "
            "default): the figures carry no user data, but are nobody else's business."
        ),
    )
    parser.add_argument("--address", default=None, help="bind address (MEMQ_EXPORTER_ADDRESS)")
    parser.add_argument("--port", type=int, default=None, help="port (MEMQ_EXPORTER_PORT)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from memq.server.exporter import serve

    settings = context.settings
    address = args.address or settings.exporter_address
    port = settings.exporter_port if args.port is None else args.port
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_term)
    host = f"[{address}]" if ":" in address else address
    print(
        f"memq exporter: http://{host}:{port}/metrics (Redis {mask_url(settings.redis_url)}, "
        f"prefix {settings.key_prefix}); Ctrl-C stops it",
        flush=True,
    )
    try:
        serve(settings, context.redis, address, port, stop)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("memq exporter: stopped", file=sys.stderr)
    return 0
