"""One settlement for both lanes: a run answered by a synchronous call and one answered by a batch
job end in :meth:`Settlement.settle`, which spends the token budget, settles the context in the
queue, adds to the counters and the bill, and writes the run's one log line.

The lanes differ only in what they hand over: the report of the fenced apply (the pipeline's, the
same for both), how the context is settled in the queue (``complete.lua`` or
``batch_complete.lua``), and the names its tokens are counted under (a batch's tokens have their
own counters; the bill, ``cost_nano_usd``, already carries the batch discount).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from memq.core.errors import MemqError
from memq.core.identity import ContextKey
from memq.core.metrics import MetricsRecorder
from memq.core.scripts import AlsoQueue
from worker.budget import TokenBudget
from worker.cost import CallUsage, PriceTable, bill_fields
from worker.report import ExtractionReport, answer_counts

log = logging.getLogger("memq.extract")

Lane = Literal["sync", "batch"]
# The metrics fields a lane's tokens are counted under (prompt, cached, completion).
_TOKEN_FIELDS: dict[Lane, tuple[str, str, str]] = {
    "sync": ("prompt_tokens", "cached_tokens", "completion_tokens"),
    "batch": ("batch_prompt_tokens", "batch_cached_tokens", "batch_completion_tokens"),
}


@dataclass(frozen=True, slots=True)
class AnsweredRun:
    """One claimed run whose answer is in (or that needed no call): what its settlement, its
    counters and its log line name."""

    context_id: str
    version: int
    lane: Lane
    started_ms: int  # epoch ms: the claim's start (sync) or the time it was parked (batch)
    trace_id: str | None = None
    batch_id: str = ""

    @property
    def user_id(self) -> str | None:
        """The user whose budget the run spends (from the id: the hash may be gone)."""
        try:
            return ContextKey.from_id(self.context_id).user_id
        except MemqError:
            return None

    def log_extra(self, outcome: str) -> dict[str, Any]:
        return {
            "memq_key": self.context_id,
            "memq_version": self.version,
            "memq_outcome": outcome,
            "memq_trace_id": self.trace_id,
            "memq_lane": self.lane,
        }


def usage_fields(
    prices: PriceTable | None, lane: Lane, report: ExtractionReport, turns: int
) -> dict[str, int]:
    """The metrics fields one answered run adds to: its tokens under its lane's names, and the
    bill (its cost at its tier's price, one billed run, ``turns`` extracted)."""
    tier = "batch" if lane == "batch" else report.service_tier
    call = CallUsage(report.prompt_tokens, report.cached_tokens, report.completion_tokens, tier)
    prompt, cached, completion = _TOKEN_FIELDS[lane]
    return {
        prompt: report.prompt_tokens,
        cached: report.cached_tokens,
        completion: report.completion_tokens,
        **bill_fields(prices, call, turns),
    }


class Settlement:
    """Settles answered runs of either lane (one per process, beside the metrics recorder)."""

    def __init__(
        self,
        metrics: MetricsRecorder,
        budget: TokenBudget | None,
        prices: PriceTable | None,
        clock: Callable[[], int],
    ) -> None:
        self.metrics = metrics
        self.budget = budget
        self.prices = prices
        self.clock = clock

    def settle(
        self,
        run: AnsweredRun,
        report: ExtractionReport,
        complete: Callable[[AlsoQueue], Enum],
    ) -> dict[str, Any]:
        """Spend, settle (``complete``: the lane's queue step, called unless the answer was
        fenced off, with the run's metrics writes to send in its round trip), count and log one
        answered run; a small summary for the task result."""
        user = run.user_id
        tokens = report.prompt_tokens + report.completion_tokens
        budget = self.budget if user is not None else None
        if report.outcome == "stale":
            if budget is not None and user is not None:
                budget.spend(user, tokens)  # a discarded answer's tokens were spent all the same
            return self._discarded(run, report)
        # Counted under its outcome even when the claim went stale after the save: what it
        # saved stays. So the figures and the budget's count do not wait for the settlement's
        # answer: they go in its round trip, or after it when they could not (a cluster,
        # another Redis).
        usage = {
            **usage_fields(self.prices, run.lane, report, report.messages_sent),
            **answer_counts(report),
        }
        counted: list[bool] = []
        spent: list[bool] = []

        def with_metrics(pipe: Any) -> bool:
            counted.append(self.metrics.queue_extraction(pipe, report.outcome, usage))
            if budget is not None and user is not None:
                spent.append(budget.queue_spend(pipe, user, tokens))
            return counted[-1] or any(spent[-1:])

        settled = complete(with_metrics).name.lower()
        if not any(counted):
            self.metrics.extraction(report.outcome, usage)
        if budget is not None and user is not None and not any(spent):
            budget.spend(user, tokens)
        log.info(
            "extraction key=%s version=%d outcome=%s lane=%s facts_added=%d facts_removed=%d "
            "facts_invalid=%d facts_refused=%d citations_repaired=%d prompt_tokens=%d "
            "cached_tokens=%d completion_tokens=%d duration_ms=%d queue=%s%s",
            run.context_id,
            run.version,
            report.outcome,
            run.lane,
            report.facts_added,
            report.facts_removed,
            report.facts_invalid,
            report.facts_refused,
            report.citations_repaired,
            report.prompt_tokens,
            report.cached_tokens,
            report.completion_tokens,
            self.clock() - run.started_ms,
            settled,
            f" batch={run.batch_id}" if run.batch_id else "",
            extra=run.log_extra(report.outcome),
        )
        return {
            "outcome": report.outcome,
            "facts_added": report.facts_added,
            "facts_removed": report.facts_removed,
            "queue": settled,
        }

    def _discarded(self, run: AnsweredRun, report: ExtractionReport) -> dict[str, Any]:
        """A run whose claim was lost before it could save: its answer is dropped (the current
        claim extracts the same messages), its tokens were spent all the same."""
        self.metrics.stale_run(usage_fields(self.prices, run.lane, report, 0))
        log.warning(
            "extraction key=%s version=%d outcome=stale answer discarded: %s lane=%s "
            "prompt_tokens=%d cached_tokens=%d completion_tokens=%d duration_ms=%d%s",
            run.context_id,
            run.version,
            report.reason,
            run.lane,
            report.prompt_tokens,
            report.cached_tokens,
            report.completion_tokens,
            self.clock() - run.started_ms,
            f" batch={run.batch_id}" if run.batch_id else "",
            extra=run.log_extra("stale"),
        )
        return {"outcome": "stale", "queue": "stale"}
