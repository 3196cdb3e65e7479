"""The bodies of the two Celery tasks, free of Celery: `extract` runs one claimed context through
the pipeline and settles it in the queue; `WorkerRuntime` holds their dependencies per process.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memq.core.connection import RedisClient, redis_client
from memq.core.errors import (
    LLMError,
    MemqError,
    RunDeferred,
)
from memq.core.identity import ContextKey
from memq.core.metrics import MetricsRecorder
from memq.core.models import ConversationContext
from memq.core.settings import MemqSettings
from storage.base import Fence
from worker.cost import CallUsage, PriceTable, cost_nano_usd
from worker.gates import RunGates
from worker.lease import LeaseKeeper
from worker.queue import FailResult, QueueClient, now_ms
from worker.retry import retry_delay_ms

if TYPE_CHECKING:
    from worker.batch import BatchLane
    from worker.batch_queue import BatchQueue
    from worker.pipeline import ExtractionPipeline, ExtractionReport

log = logging.getLogger("memq.extract")

_DEFER_SPREAD_MS = 100  # spread of runs deferred together without a slot of their own


class WorkerRuntime:
    """Redis client, queue client, metrics recorder and extraction pipeline, built lazily once
    per process.

    Lazy because a prefork worker forks after the app is built: connections and the LLM client
    must be created in the child that uses them (the pid check rebuilds after a fork).
    """

    def __init__(
        self,
        settings: MemqSettings,
        *,
        pipeline_factory: Callable[[MemqSettings, RedisClient], ExtractionPipeline] | None = None,
    ) -> None:
        self.settings = settings
        self._pipeline_factory = pipeline_factory or build_pipeline
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._redis: RedisClient | None = None
        self._queue: QueueClient | None = None
        self._metrics: MetricsRecorder | None = None
        self._pipeline: ExtractionPipeline | None = None
        self._gates: RunGates | None = None
        self.prices = PriceTable.from_settings(settings)
        self._batches: BatchQueue | None = None
        self._lane: BatchLane | None = None

    @property
    def client(self) -> RedisClient:
        return self._base()[0]

    @property
    def queue(self) -> QueueClient:
        return self._base()[1]

    @property
    def metrics(self) -> MetricsRecorder:
        return self._base()[2]

    @property
    def pipeline(self) -> ExtractionPipeline:
        with self._lock:
            self._check_fork()
            if self._pipeline is None:
                self._pipeline = self._pipeline_factory(self.settings, self._base_locked()[0])
            return self._pipeline

    @property
    def gates(self) -> RunGates:
        """The token budgets and the shared rate limit, asked before each model call."""
        with self._lock:
            self._check_fork()
            if self._gates is None:
                self._gates = RunGates(self.settings, self._base_locked()[0])
            return self._gates

    @property
    def batches(self) -> BatchQueue:
        """The batch lane's queue operations (its scripts registered once per process)."""
        from worker.batch_queue import BatchQueue

        with self._lock:
            self._check_fork()
            if self._batches is None:
                self._batches = BatchQueue(self.settings, self._base_locked()[0])
            return self._batches

    def batch_lane(self) -> BatchLane:
        """The gatherer and poller of batch jobs (the ``memq.batch`` task)."""
        from worker.batch import BatchLane
        from worker.batch_api import OpenAIBatchEndpoint

        pipeline, batches = self.pipeline, self.batches
        with self._lock:
            if self._lane is None:
                self._lane = BatchLane(
                    self.settings,
                    self._base_locked()[1],
                    batches,
                    pipeline,
                    OpenAIBatchEndpoint(self.settings),
                )
            return self._lane

    def _base(self) -> tuple[RedisClient, QueueClient, MetricsRecorder]:
        with self._lock:
            self._check_fork()
            return self._base_locked()

    def _base_locked(self) -> tuple[RedisClient, QueueClient, MetricsRecorder]:
        if self._redis is None or self._queue is None or self._metrics is None:
            # Worker-side calls ride out a short Redis restart (a few seconds) instead of failing
            # the run's settlement and leaving its context to wait for its lease.
            self._redis = redis_client(self.settings, outage_retries=8)
            self._queue = QueueClient(self.settings, self._redis)
            self._metrics = MetricsRecorder.for_settings(self.settings, self._redis)
            self._pid = os.getpid()
        return self._redis, self._queue, self._metrics

    def _check_fork(self) -> None:
        if self._pid is not None and self._pid != os.getpid():
            self._redis = self._queue = self._pipeline = self._metrics = self._gates = None
            self._batches = self._lane = None
            self._pid = None


def build_pipeline(settings: MemqSettings, client: RedisClient) -> ExtractionPipeline:
    """The production pipeline: configured storage and LLM (imported here, not at module load,
    so the ticker and the app factory never load the LLM client)."""
    from storage import get_storage
    from worker.llm import build_update_model
    from worker.pipeline import ExtractionPipeline
    from worker.ratelimit import SharedRateLimit

    limiter = SharedRateLimit.for_settings(settings, client)
    return ExtractionPipeline(
        settings,
        get_storage(settings, redis=client),
        build_update_model(
            settings,
            observe=MetricsRecorder.for_settings(settings, client).llm_request,
            on_limits=None if limiter is None else limiter.observe,
        ),
    )


def describe_args(context_id: str, version: int) -> str:
    """What Flower shows as the task's arguments: identifiers, never message content."""
    try:
        key = ContextKey.from_id(context_id)
    except MemqError:
        return f"key={context_id!r:.200} version={version}"
    return f"{key.describe()} version={version}"


@dataclass(frozen=True, slots=True)
class _Run:
    """One claimed run: what its settlement and its log line name."""

    queue: QueueClient
    metrics: MetricsRecorder
    context_id: str
    token: str
    version: int
    started: int  # epoch ms
    clock: Callable[[], int]
    prices: PriceTable | None = None

    def usage(self, report: ExtractionReport, turns: int) -> dict[str, int]:
        """The metrics fields this run's usage adds to, its bill included."""
        call = CallUsage(
            report.prompt_tokens,
            report.cached_tokens,
            report.completion_tokens,
            report.service_tier,
        )
        return {
            "prompt_tokens": report.prompt_tokens,
            "completion_tokens": report.completion_tokens,
            "cached_tokens": report.cached_tokens,
            "cost_nano_usd": cost_nano_usd(self.prices, call),
            "billed_runs": int(report.prompt_tokens > 0),
            "turns_extracted": turns,
        }

    def log_extra(self, outcome: str) -> dict[str, Any]:
        return {"memq_key": self.context_id, "memq_version": self.version, "memq_outcome": outcome}


def extract(
    runtime: WorkerRuntime,
    context_id: str,
    token: str,
    version: int,
    *,
    clock: Callable[[], int] = now_ms,
) -> dict[str, Any]:
    """Run one claimed context; returns a small summary (Flower shows it as the task result)."""
    run = _Run(
        runtime.queue, runtime.metrics, context_id, token, version, clock(), clock, runtime.prices
    )
    data, watermark = run.queue.load_run(context_id)
    if not _start(run, data):
        return {"outcome": "stale"}
    attempts = int(data.get("attempts") or 0)
    try:
        context = ConversationContext.from_hash(data)
    except MemqError as exc:  # a context that does not decode never will: dead at once
        return _failed(run, exc, None)
    may_batch = runtime.settings.llm_batch_active and data.get("claimed_sync") != "1"
    try:
        report = _run_pipeline(runtime, run, context, watermark, _slot(data), may_batch=may_batch)
    except RunDeferred as exc:
        return _deferred(run, exc)
    except Exception as exc:
        delay = retry_delay_ms(exc, attempts, runtime.settings)
        return _failed(run, exc, None if delay is None else clock() + delay)
    if report is None:
        log.info(
            "extraction key=%s version=%d outcome=batched (waits for a batch job)",
            run.context_id,
            run.version,
            extra=run.log_extra("batched"),
        )
        return {"outcome": "batched", "queue": "batched"}
    budget = runtime.gates.budget
    if budget is not None:
        budget.spend(context.user_id, report.prompt_tokens + report.completion_tokens)
    if report.outcome == "stale":
        return _discarded(run, report)
    return _completed(run, context, report)


def _start(run: _Run, data: dict[str, Any]) -> bool:
    """Renew the lease at once; False (logged, counted) when the claim is already gone.

    This first renew also marks the claim as started: from here on, a lease that expires counts
    as an attempt (a task that never got this far, e.g. dropped by Celery past its `expires`, is
    requeued by the reaper without one).
    """
    if data.get("claim_token") == run.token and run.queue.renew(
        run.context_id, run.token, run.started
    ):
        return True
    log.info(
        "extraction key=%s version=%d outcome=stale (claim gone before start)",
        run.context_id,
        run.version,
    )
    run.metrics.stale_run()
    return False


def _slot(data: dict[str, Any]) -> int | None:
    """The rate-limit slot an earlier deferral reserved for this run, if any."""
    try:
        return int(data["rate_slot_ms"])
    except (KeyError, TypeError, ValueError):
        return None


def _run_pipeline(
    runtime: WorkerRuntime,
    run: _Run,
    context: ConversationContext,
    watermark: str | None,
    slot_ms: int | None = None,
    *,
    may_batch: bool = False,
) -> ExtractionReport | None:
    """The pipeline, with the lease renewed in the background while it runs. With ``may_batch``
    a run that fits one prompt is parked for the batch lane instead (None); a synchronous run
    asks the budgets and the shared rate limit first (``slot_ms``: a slot reserved for it)."""
    settings = runtime.settings
    fence = Fence(run.context_id, run.token)
    with LeaseKeeper(
        run.queue,
        run.context_id,
        run.token,
        lease_seconds=settings.lease_seconds,
        renew_until_ms=run.started + int(settings.run_hard_limit_seconds * 1000),
        clock=run.clock,
    ):
        gate = runtime.gates.gate_for(context.user_id, slot_ms)
        if not may_batch:
            return runtime.pipeline.run(context, watermark=watermark, fence=fence, gate=gate)
        from worker.batch import park
        from worker.pipeline import ExtractionReport

        step = runtime.pipeline.prepare(context, watermark=watermark, fence=fence)
        if isinstance(step, ExtractionReport):
            return step
        if step.selection.more:  # over one prompt's budget: chunks go synchronously
            return runtime.pipeline.finish(context, step, fence=fence, gate=gate)
        if park(settings, runtime.batches, runtime.pipeline, context, run.token, step, run.clock()):
            return None
        return ExtractionReport("stale", reason="claim gone before the run was parked")


def _completed(run: _Run, context: ConversationContext, report: ExtractionReport) -> dict[str, Any]:
    """Settle a run that saved (or had nothing to save); counted under its outcome even when
    the claim went stale after the save, since what it saved stays."""
    # The watermark advances with the settlement, never before: a run that fails or lost its
    # claim leaves it where it was, so its messages are sent again.
    settled = run.queue.complete(
        run.context_id, run.token, run.clock(), watermark=report.watermark, more=report.more
    )
    duration = run.clock() - run.started
    run.metrics.extraction(
        report.outcome,
        {
            **run.usage(report, report.messages_sent),
            "facts_invalid": report.facts_invalid,
            "facts_refused": report.facts_refused,
        },
    )
    log.info(
        "extraction key=%s version=%d outcome=%s facts_added=%d facts_removed=%d "
        "facts_invalid=%d facts_refused=%d prompt_tokens=%d cached_tokens=%d "
        "completion_tokens=%d duration_ms=%d queue=%s",
        run.context_id,
        run.version,
        report.outcome,
        report.facts_added,
        report.facts_removed,
        report.facts_invalid,
        report.facts_refused,
        report.prompt_tokens,
        report.cached_tokens,
        report.completion_tokens,
        duration,
        settled.name.lower(),
        extra={**run.log_extra(report.outcome), "memq_trace_id": context.trace_id},
    )
    return {
        "outcome": report.outcome,
        "facts_added": report.facts_added,
        "facts_removed": report.facts_removed,
        "queue": settled.name.lower(),
    }


def _discarded(run: _Run, report: ExtractionReport) -> dict[str, Any]:
    """A run whose claim was lost before it could save: its answer is dropped (the current claim
    extracts the same messages), its tokens were spent all the same."""
    run.metrics.stale_run(run.usage(report, 0))
    log.warning(
        "extraction key=%s version=%d outcome=stale answer discarded: %s prompt_tokens=%d "
        "cached_tokens=%d completion_tokens=%d duration_ms=%d",
        run.context_id,
        run.version,
        report.reason,
        report.prompt_tokens,
        report.cached_tokens,
        report.completion_tokens,
        run.clock() - run.started,
        extra=run.log_extra("stale"),
    )
    return {"outcome": "stale", "queue": "stale"}


def _deferred(run: _Run, exc: RunDeferred) -> dict[str, Any]:
    """The run may not call the model yet: back to `due` at the next free slot, no attempt."""
    at = exc.retry_at_ms
    if exc.slot_ms is None:
        # No slot of its own: a little spread, so runs refused together come back apart.
        at += random.randrange(0, _DEFER_SPREAD_MS)
    deferred = run.queue.defer(run.context_id, run.token, at, exc.slot_ms)
    if deferred:
        run.metrics.deferral(exc.reason)
    log.info(
        "extraction key=%s version=%d outcome=deferred reason=%s run_at_ms=%d queue=%s",
        run.context_id,
        run.version,
        exc.reason,
        at,
        "due" if deferred else "stale",
        extra=run.log_extra("deferred"),
    )
    return {"outcome": "deferred", "queue": "due" if deferred else "stale"}


def _failed(run: _Run, exc: BaseException, retry_at_ms: int | None) -> dict[str, Any]:
    """Settle a failed run: retry at ``retry_at_ms`` or, when None, dead at once."""
    reason = public_reason(exc)
    settled = run.queue.fail(run.context_id, run.token, reason, retry_at_ms, run.clock())
    if settled is FailResult.STALE:
        run.metrics.stale_run()
    else:
        run.metrics.extraction("dead" if settled is FailResult.DEAD else "retry")
    log.warning(
        "extraction key=%s version=%d outcome=%s error=%s duration_ms=%d%s",
        run.context_id,
        run.version,
        settled.name.lower(),
        reason,
        run.clock() - run.started,
        "" if isinstance(exc, MemqError) else "\n" + content_free_traceback(exc),
        extra=run.log_extra("failed"),
    )
    log.debug("extraction key=%s failed", run.context_id, exc_info=exc)
    return {"outcome": "failed", "queue": settled.name.lower(), "error": type(exc).__name__}


def public_reason(exc: BaseException) -> str:
    """What a failure is stored and shown as (dead letters, Flower): the error's type, and for
    the LLM errors, which memq words from the type, HTTP status and answer shape alone, their
    message. Never any other exception's text, which can quote the conversation (an endpoint's
    error body, pydantic's input in its message)."""
    if isinstance(exc, LLMError):
        return f"{type(exc).__name__}: {exc}"[:500]
    return type(exc).__name__


def content_free_traceback(exc: BaseException) -> str:
    """The traceback of an unexpected failure with each exception's message left out: where it
    broke is the operator's to see, the text it broke on may be the user's."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    parts = []
    for error in reversed(chain):
        frames = "".join(traceback.format_tb(error.__traceback__))
        parts.append(f"{frames}{type(error).__module__}.{type(error).__qualname__}: (hidden)")
    return "\n-- then --\n".join(parts)
