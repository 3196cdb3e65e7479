"""`memq eval locomo FILE` / `memq eval longmemeval FILE`: memory quality, cost and latency on the
public benchmarks, with the configured model (see :mod:`memq.evaluation`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from memq.commands.common import CommandContext


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "eval",
        help="measure memory quality, cost and latency on LoCoMo or LongMemEval",
        description="Replay a benchmark's conversations through memq (producer, workers, the "
        "configured model), answer its questions from the recalled memory and grade them with "
        "an LLM judge. The data set is read from FILE; memq neither ships nor downloads it.",
    )
    benchmarks = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, what in (
        ("locomo", "LoCoMo's locomo10.json (snap-research/locomo)"),
        ("longmemeval", "LongMemEval's longmemeval_s.json / _m / _oracle"),
    ):
        one = benchmarks.add_parser(name, help=what)
        one.add_argument("file", type=Path, help=what)
        _options(one)
        one.set_defaults(run=run)


def _options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--out", type=Path, help="results folder (default eval-results/<benchmark>-<file name>)")
    add("--conversations", default="", help="only these conversation ids (comma-separated)")
    add("--limit", type=int, help="only the first N conversations (after --conversations)")
    add("--answer-model", help="model that answers the questions (default: the extraction model)")
    add("--judge-model", help="model that grades the answers (default: the extraction model)")
    add("--price-input", type=float, help="USD per million prompt tokens (all three models)")
    add("--price-output", type=float, help="USD per million completion tokens")
    add("--price-cached", type=float, help="USD per million cached prompt tokens")
    add("--concurrency", type=int, default=4, help="conversations replayed at once (default 4)")
    add("--answer-concurrency", type=int, default=4, help="questions asked at once (default 4)")
    add("--workers", type=int, default=4, help="threads of memq's own worker (default 4)")
    add(
        "--external-workers",
        action="store_true",
        help="do not start a worker and ticker: use ones running with MEMQ_KEY_PREFIX set to the "
        "eval key prefix",
    )
    add("--key-prefix", help="key prefix of the evaluation (default <MEMQ_KEY_PREFIX>-eval)")
    add(
        "--debounce-seconds",
        type=float,
        default=3600.0,
        help="producer debounce; long by default so each session is one extraction, at its flush",
    )
    add("--extraction-timeout", type=float, default=600.0, help="seconds to wait per session")
    add("--keep", action="store_true", help="keep the evaluation users at the end")
    add("--fresh", action="store_true", help="ignore an existing checkpoint and start over")
    add("--yes", action="store_true", help="start without asking after the estimate")
    add("--estimate-only", action="store_true", help="print the estimate and stop")
    add("--no-progress", action="store_true", help="no progress bars on stderr")
    add(
        "--ideal",
        action="store_true",
        help="recall only, no model: the data set's observations as the facts (said at their "
        "session's date), an ideal reader; reports how often the evidence reaches the block",
    )


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from memq.commands.common import CommandError
    from memq.evaluation.evaluate import EvalRequest, run_eval

    for name in ("concurrency", "answer_concurrency", "workers"):
        if getattr(args, name) < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1")
    out = args.out or Path("eval-results") / f"{args.benchmark}-{Path(args.file).stem}"
    request = EvalRequest(
        benchmark=args.benchmark,
        path=Path(args.file),
        out_dir=Path(out),
        conversations=tuple(c.strip() for c in args.conversations.split(",") if c.strip()),
        limit=args.limit,
        key_prefix=args.key_prefix,
        answer_model=args.answer_model,
        judge_model=args.judge_model,
        price_input=args.price_input,
        price_output=args.price_output,
        price_cached=args.price_cached,
        concurrency=args.concurrency,
        answer_concurrency=args.answer_concurrency,
        workers=args.workers,
        external_workers=args.external_workers,
        debounce_seconds=args.debounce_seconds,
        extraction_timeout_seconds=args.extraction_timeout,
        keep=args.keep,
        fresh=args.fresh,
        yes=args.yes,
        estimate_only=args.estimate_only,
        progress=not args.no_progress,
        ideal=args.ideal,
    )
    return run_eval(request)
