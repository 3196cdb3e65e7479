"""`memq demo` (what `make demo` runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from memq.commands.common import CommandContext


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo",
        help="run the embedded stack on sample conversations and print what memq learned",
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path(".memq/demo"), help="demo folder (default .memq/demo)"
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for the extractions"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from memq.demo import run_demo

    return run_demo(args.data_dir, timeout_seconds=args.timeout)
