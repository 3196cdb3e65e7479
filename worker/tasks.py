"""The bodies of the two Celery tasks, free of Celery: `extract` runs one claimed context through
the pipeline and settles it in the queue (their per-process dependencies: `worker/runtime.py`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memq.core.clock import now_ms
from memq.core.errors import (
    MemqError,
    RunDeferred,
)
from memq.core.identity import ContextKey
from memq.core.metrics import MetricsRecorder
from memq.core.models import ConversationContext
from storage.base import Fence, PendingRead
from worker.lease import LeaseKeeper
from worker.queue import FailResult, QueueClient
from worker.retry import content_free_traceback, public_reason, retry_delay_ms
from worker.runtime import WorkerRuntime
from worker.settle import AnsweredRun

if TYPE_CHECKING:
    from worker.report import ExtractionReport

log = logging.getLogger("memq.extract")

_DEFER_SPREAD_MS = 100  # spread of runs deferred together without a slot of their own


def describe_args(context_id: str) -> str:
    """What Flower shows as the task's arguments: identifiers, never message content."""
    try:
        key = ContextKey.from_id(context_id)
    except MemqError:
        return f"key={context_id!r:.200}"
    return key.describe()


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

    def log_extra(self, outcome: str) -> dict[str, Any]:
        return {"memq_key": self.context_id, "memq_version": self.version, "memq_outcome": outcome}

    def answered(self, context: ConversationContext) -> AnsweredRun:
        return AnsweredRun(
            self.context_id, self.version, "sync", self.started, trace_id=context.trace_id
        )


def extract(
    runtime: WorkerRuntime,
    context_id: str,
    token: str,
    *,
    clock: Callable[[], int] = now_ms,
) -> dict[str, Any]:
    """Run one claimed context; returns a small summary (Flower shows it as the task result)."""
    started = clock()
    # The memory the run extracts into is read in the same round trip as its context.
    memory = runtime.pending_memory(context_id)
    data, watermark, renewed = runtime.queue.start_run(context_id, token, started, also=memory)
    # The version the run's start recorded (worker/renew.lua) is the one it extracts.
    version = int(data.get("claimed_version") or data.get("version") or 0)
    run = _Run(runtime.queue, runtime.metrics, context_id, token, version, started, clock)
    if not _start(run, data, renewed):
        return {"outcome": "stale"}
    attempts = int(data.get("attempts") or 0)
    try:
        context = ConversationContext.from_hash(data)
    except MemqError as exc:  # a context that does not decode never will: dead at once
        return _failed(run, exc, None)
    may_batch = runtime.settings.llm_batch_active and data.get("claimed_sync") != "1"
    try:
        report = _run_pipeline(
            runtime, run, context, watermark, _slot(data), memory, may_batch=may_batch
        )
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
    return runtime.settlement(clock).settle(
        run.answered(context),
        report,
        lambda also: run.queue.complete(
            run.context_id,
            run.token,
            run.clock(),
            watermark=report.watermark,
            more=report.more,
            also=also,
        ),
    )


def _start(run: _Run, data: dict[str, Any], renewed: bool) -> bool:
    """The lease renewed at once (``renewed``: sent with the run's first read); False (logged,
    counted) when the claim is already gone.

    This first renew also marks the claim as started: from here on, a lease that expires counts
    as an attempt (a task that never got this far, e.g. dropped by Celery past its `expires`, is
    requeued by the reaper without one).
    """
    if data.get("claim_token") == run.token and renewed:
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
    memory: PendingRead | None = None,
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
            return runtime.pipeline.run(
                context, watermark=watermark, fence=fence, gate=gate, memory=memory
            )
        from worker.batch import park
        from worker.report import ExtractionReport

        step = runtime.pipeline.prepare(context, watermark=watermark, fence=fence, memory=memory)
        if isinstance(step, ExtractionReport):
            return step
        if step.selection.more:  # over one prompt's budget: chunks go synchronously
            return runtime.pipeline.finish(context, step, fence=fence, gate=gate)
        # A batch request asks the budgets as a call does (and spends at its settlement).
        runtime.gates.admit_batch(context.user_id)
        batches, pipeline, formats = runtime.batches, runtime.pipeline, runtime.formats
        if park(settings, batches, pipeline, context, run.token, step, run.clock(), formats):
            return None
        return ExtractionReport("stale", reason="claim gone before the run was parked")


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
