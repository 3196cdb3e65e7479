"""One `memq eval` run from start to end: settings, estimate, confirmation, the run, the report.

The evaluation works under its own key prefix (``<key_prefix>-eval`` unless ``--key-prefix`` says
otherwise), so its users, queue and metrics never mix with real ones, and its users are erased at
the end unless ``--keep``. Its debounce is long (an hour by default): every turn is still handed
over, but only each session's flush makes a run due, so a session costs one extraction (more only
where the worker's chunk budget splits it) and the estimate can count them. By default memq starts
its own worker and ticker for that prefix (on the configured Redis, or a private one when none is
configured); ``--external-workers`` uses workers the user runs with ``MEMQ_KEY_PREFIX`` set to it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from memq.core.errors import ConfigError, MemqError
from memq.core.json_files import read_json_file
from memq.core.settings import MemqSettings, load_settings
from memq.evaluation.checkpoint import Checkpoint
from memq.evaluation.dataset import Benchmark, DatasetError, EvalSet
from memq.evaluation.estimate import Estimate, estimate
from memq.evaluation.locomo import read_locomo
from memq.evaluation.longmemeval import read_longmemeval
from memq.evaluation.report import (
    CHART_FILE,
    Models,
    PriceTable,
    build_result,
    estimate_json,
    markdown,
    metrics_delta,
    svg_chart,
)
from memq.evaluation.runner import ChatModel, Runner, RunOptions, facts_of
from memq.evaluation.scoring import Prices

CHECKPOINT_FILE = "checkpoint.jsonl"
RESULT_FILE = "results.json"
REPORT_FILE = "report.md"
DEFAULT_DEBOUNCE_SECONDS = 3600.0
# Settings fields a price table may provide (US dollars per million tokens), read when present.
# The workers' price table: what their bill is priced with, and the eval's prices when the
# command line gives none.
PRICE_FIELDS = (
    "llm_price_input_per_million",
    "llm_price_output_per_million",
    "llm_price_cached_input_per_million",
)


@dataclass(frozen=True, slots=True)
class EvalRequest:
    benchmark: Benchmark
    path: Path
    out_dir: Path
    conversations: tuple[str, ...] = ()
    limit: int | None = None
    key_prefix: str | None = None
    answer_model: str | None = None
    judge_model: str | None = None
    price_input: float | None = None
    price_output: float | None = None
    price_cached: float | None = None
    concurrency: int = 4
    answer_concurrency: int = 4
    workers: int = 4
    external_workers: bool = False
    debounce_seconds: float = DEFAULT_DEBOUNCE_SECONDS
    extraction_timeout_seconds: float = 600.0
    keep: bool = False
    fresh: bool = False
    yes: bool = False
    estimate_only: bool = False
    progress: bool = True
    # Recall only: the data set's observations as the facts, an ideal reader, no model at all.
    ideal: bool = False


def load_evalset(benchmark: Benchmark, path: Path) -> EvalSet:
    data = read_json_file(path, DatasetError)
    reader = read_locomo if benchmark == "locomo" else read_longmemeval
    return reader(data)


def eval_settings(request: EvalRequest) -> MemqSettings:
    base = load_settings()
    prefix = request.key_prefix or f"{base.key_prefix}-eval"
    overrides: dict[str, Any] = {
        "key_prefix": prefix,
        "debounce_seconds": request.debounce_seconds,
        "max_delay_seconds": max(86400.0, request.debounce_seconds),
        "worker_concurrency": request.workers,
    }
    if not request.external_workers:
        overrides["data_dir"] = request.out_dir / "stack"
    if request.price_input is not None and request.price_output is not None:
        # The workers memq starts bill at these prices (external workers keep their own).
        prices = (request.price_input, request.price_output, request.price_cached)
        overrides.update({k: v for k, v in zip(PRICE_FIELDS, prices, strict=True) if v is not None})
    settings = load_settings(**overrides)
    if settings.resolved_llm_provider == "rules":
        raise ConfigError(
            "memq eval needs a model for answering and judging: set MEMQ_LLM_BASE_URL (and "
            "MEMQ_LLM_API_KEY or OPENAI_API_KEY) to an OpenAI-compatible endpoint"
        )
    return settings


def price_table(request: EvalRequest, settings: MemqSettings) -> PriceTable:
    if request.price_input is not None or request.price_output is not None:
        if request.price_input is None or request.price_output is None:
            raise ConfigError("give both --price-input and --price-output (USD per million)")
        prices = Prices(request.price_input, request.price_output, request.price_cached)
        return PriceTable(prices, prices, prices, "--price-input/--price-output")
    found = [getattr(settings, name, None) for name in PRICE_FIELDS]
    if found[0] is not None and found[1] is not None:
        prices = Prices(float(found[0]), float(found[1]), found[2])
        return PriceTable(prices, prices, prices, "settings")
    return PriceTable(None, None, None, "none given (pass --price-input/--price-output)")


def describe_estimate(planned: Estimate, models: Models, resumed: bool) -> str:
    def money(value: float | None) -> str:
        return "unknown (no prices)" if value is None else f"${value:,.2f}"

    ex, an, ju = planned.extraction, planned.answer, planned.judge
    head = "still to spend (resuming)" if resumed else "this run will spend about"
    return "\n".join(
        [
            f"{planned.conversations} conversations, {planned.sessions} sessions, "
            f"{planned.turns} turns, {planned.hand_offs} hand-offs, {planned.questions} questions",
            f"{head}:",
            f"  extraction ({models.extraction}): {ex.calls:,} calls, ~{ex.prompt_tokens:,} prompt "
            f"+ ~{ex.completion_tokens:,} completion tokens, {money(planned.extraction_cost)}",
            f"  answers ({models.answer}): {an.calls:,} calls, ~{an.prompt_tokens:,} prompt "
            f"+ ~{an.completion_tokens:,} completion tokens, {money(planned.answer_cost)}",
            f"  judge ({models.judge}): {ju.calls:,} calls, ~{ju.prompt_tokens:,} prompt "
            f"+ ~{ju.completion_tokens:,} completion tokens, {money(planned.judge_cost)}",
            f"  total: {money(planned.total_cost)}",
        ]
    )


def confirmed(request: EvalRequest, ask: Callable[[str], str], interactive: bool) -> bool:
    if request.yes:
        return True
    if not interactive:
        raise MemqError("nothing spent: re-run with --yes to start without being asked")
    return ask("Proceed? [y/N] ").strip().lower() in ("y", "yes")


def run_eval(
    request: EvalRequest,
    *,
    out: TextIO | None = None,
    ask: Callable[[str], str] = input,
    interactive: bool | None = None,
) -> int:
    out = out or sys.stdout
    evalset = load_evalset(request.benchmark, request.path).select(
        conversations=request.conversations, limit=request.limit
    )
    if request.ideal:
        return _run_ideal(request, evalset, out)
    settings = eval_settings(request)
    models = Models(
        settings.llm_model,
        request.answer_model or settings.llm_model,
        request.judge_model or settings.llm_model,
    )
    prices = price_table(request, settings)
    identity = {
        "benchmark": request.benchmark,
        "file": str(request.path.resolve()),
        "key_prefix": settings.key_prefix,
        "conversations": [c.id for c in evalset.conversations],
    }
    checkpoint = Checkpoint.open(request.out_dir / CHECKPOINT_FILE, identity, fresh=request.fresh)
    try:
        return _run(request, evalset, settings, models, prices, checkpoint, out, ask, interactive)
    finally:
        checkpoint.close()


def _run_ideal(request: EvalRequest, evalset: EvalSet, out: TextIO) -> int:
    from memq.evaluation.ideal import ideal_markdown, run_ideal

    if not evalset.observations:
        raise DatasetError("--ideal needs a data set with observations (LoCoMo's)")
    result = run_ideal(evalset, load_settings(), request.out_dir)
    text = ideal_markdown(result)
    (request.out_dir / REPORT_FILE).write_text(text, encoding="utf-8")
    out.write(text)
    return 0


def _run(
    request: EvalRequest,
    evalset: EvalSet,
    settings: MemqSettings,
    models: Models,
    prices: PriceTable,
    checkpoint: Checkpoint,
    out: TextIO,
    ask: Callable[[str], str],
    interactive: bool | None,
) -> int:
    from prompts.tokens import make_token_counter

    count = make_token_counter(settings.token_counting)
    planned = estimate(
        evalset,
        settings,
        count,
        extraction_prices=prices.extraction,
        answer_prices=prices.answer,
        judge_prices=prices.judge,
        skip_conversations=checkpoint.conversations_done(),
        skip_sessions=checkpoint.done_sessions(),
        skip_questions=checkpoint.judged_questions(),
    )
    print(describe_estimate(planned, models, checkpoint.resumed), file=out, flush=True)
    print(f"prices: {prices.source}; key prefix: {settings.key_prefix}", file=out, flush=True)
    if request.estimate_only:
        return 0
    tty = sys.stdin.isatty() if interactive is None else interactive
    if not confirmed(request, ask, tty):
        print("nothing spent.", file=out)
        return 1
    checkpoint.set_first_estimate(estimate_json(planned))
    with ExitStack() as resources:
        on_poll: Callable[[], None] = lambda: None  # noqa: E731 - replaced when memq owns workers
        if not request.external_workers:
            from memq.local.options import StackOptions
            from memq.local.stack import Stack

            options = StackOptions(flower=False, log_dir=request.out_dir / "logs")
            stack = resources.enter_context(Stack(settings, options))
            settings, on_poll = stack.settings, stack.check
        runner = _runner(evalset, settings, checkpoint, request, models, count, on_poll, resources)
        answer = resources.enter_context(closing(ChatModel(settings, models.answer)))
        judge = resources.enter_context(closing(ChatModel(settings, models.judge)))
        runner.run(answer, judge)
        delta = metrics_delta(runner.read_metrics(), checkpoint.metrics_baseline())
        result = build_result(
            evalset,
            {q.id: checkpoint.question(q.id) for q in evalset.questions},
            checkpoint.sessions(),
            facts_of(checkpoint, evalset.conversations),
            delta,
            models,
            prices,
            checkpoint.first_estimate() or estimate_json(planned),
        )
        _write(request.out_dir, result)
        if not request.keep:
            runner.erase_users()
    print(markdown(result), file=out)
    print(
        f"results: {request.out_dir / RESULT_FILE}, report: {request.out_dir / REPORT_FILE}",
        file=out,
    )
    return 0


def _runner(
    evalset: EvalSet,
    settings: MemqSettings,
    checkpoint: Checkpoint,
    request: EvalRequest,
    models: Models,
    count: Any,
    on_poll: Callable[[], None],
    resources: ExitStack,
) -> Runner:
    from memq.core.connection import redis_client
    from producer.injector import MemoryInjector
    from producer.producer import MemoryProducer
    from storage import get_storage
    from worker.queue import QueueClient

    redis = redis_client(settings, socket_timeout=10.0, max_connections=32)
    resources.callback(redis.close)
    storage = get_storage(settings, redis=redis)
    producer = resources.enter_context(MemoryProducer(settings))
    options = RunOptions(
        answer_model=models.answer,
        judge_model=models.judge,
        concurrency=request.concurrency,
        answer_concurrency=request.answer_concurrency,
        extraction_timeout_seconds=request.extraction_timeout_seconds,
        progress=request.progress,
    )
    return Runner(
        evalset,
        settings,
        checkpoint,
        options,
        redis=redis,
        storage=storage,
        producer=producer,
        injector=MemoryInjector(settings, storage),
        queue=QueueClient(settings, redis),
        count_tokens=count,
        on_poll=on_poll,
    )


def _write(out_dir: Path, result: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RESULT_FILE).write_text(
        json.dumps(result, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    (out_dir / REPORT_FILE).write_text(markdown(result), encoding="utf-8")
    (out_dir / CHART_FILE).write_text(svg_chart(result), encoding="utf-8")
