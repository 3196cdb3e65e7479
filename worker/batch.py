"""The batch lane: work that can wait goes out in a provider's batch job, at batch prices.

A claimed run that is not urgent (no flush, not over the prompt's budget, not sent back by a
failed job) builds its prompt as a synchronous run would and *parks* it (:func:`park`) instead of
calling the model. :class:`BatchLane` — the ``memq.batch`` task the ticker sends when there is
batch work — gathers each shard's parked runs into a job, polls the jobs out, and hands every
answer to the pipeline's fenced apply (:meth:`ExtractionPipeline.apply_answer`), covering the
watermark the request was built for: messages that arrived meanwhile stay pending. A job that
failed, expired or was cancelled, a request answered with an error or not at all, and a job we
lost track of send their contexts back to a synchronous run. Nothing here sleeps.

Applied once: the save is fenced by the claim token the context was parked with, and stores the
request's watermark with the document; a poll that finds that watermark already stored (a worker
killed between the save and the settlement) settles without applying again. One process at a time
gathers and polls a shard (its batch lock); a cycle starts no new step once its time is up, so it
ends before the lock can expire.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import cast

from memq.core.clock import now_ms
from memq.core.errors import LLMError, MemqError
from memq.core.keys import QueueKeys
from memq.core.metrics import MetricsRecorder
from memq.core.models import ConversationContext, Message
from memq.core.settings import MemqSettings
from memq.core.timestamps import ms_datetime, stored_ms
from prompts.conversation import message_text
from storage.base import Fence
from storage.provenance import RunInfo, RunMessage
from storage.sources import Role
from worker.batch_api import BatchEndpoint
from worker.batch_jobs import FINISHED, RequestResult, read_results, request_lines
from worker.batch_queue import (
    BATCH_CYCLE_SECONDS,
    BATCH_LOCK_MS,
    BatchQueue,
    OutRequest,
    parked_with,
)
from worker.budget import TokenBudget
from worker.cost import PriceTable, prompt_cache_key
from worker.llm import chat_request
from worker.model import ModelAnswer
from worker.pipeline import ExtractionPipeline, Prepared, saved_report, stale_report
from worker.queue import QueueClient
from worker.report import usage_of
from worker.response_format import FormatChoice
from worker.settle import AnsweredRun, Settlement
from worker.watermark import message_identity

log = logging.getLogger("memq.batch")


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def request_body(
    settings: MemqSettings,
    prepared: Prepared,
    cache_key: str | None = None,
    formats: FormatChoice | None = None,
) -> str:
    """The request a parked run sends, the body of a synchronous call: its prompt cache key
    included (a batch request is a chat completion, so the provider caches its prefix too), its
    response format the one the process's synchronous calls send now (``formats``)."""
    body = chat_request(
        prepared.prompt,
        model=settings.llm_model,
        temperature=settings.llm_temperature,
        response_format=(formats or FormatChoice(settings.llm_response_format)).current(),
    )
    if cache_key and settings.llm_prompt_cache_key:
        body["prompt_cache_key"] = cache_key
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def run_to_json(run: RunInfo) -> str:
    """What a parked run's facts will cite — labels, digests, roles and the excerpts a cited
    source keeps (already made safe to store; the parked request beside it holds the whole
    prompt, and both go with the context) — so a batch answer's facts get the sources a
    synchronous run's would."""
    return json.dumps(
        {
            "thread_id": run.thread_id,
            "run_id": run.run_id,
            "at": run.at.isoformat(),
            "messages": [
                [m.label, m.digest, m.role, m.excerpt, _said_ms(m.said_at)] for m in run.messages
            ],
            "prompt_version": run.prompt_version,
            "user_confirmed": run.user_confirmed,
        }
    )


def run_from_json(text: str, model: str) -> RunInfo:
    """The run a parked request was built for, answered by ``model``; ValueError when unreadable."""
    try:
        raw = json.loads(text)
        return RunInfo(
            thread_id=raw["thread_id"],
            run_id=str(raw["run_id"]),
            at=datetime.fromisoformat(raw["at"]),
            # A run parked before excerpts (message times) were kept has three (four) items
            # per message.
            messages=tuple(
                RunMessage(
                    str(m[0]),
                    str(m[1]),
                    cast("Role", m[2]),
                    str(m[3]) if m[3:] else "",
                    _said_datetime(m[4] if m[4:] else None),
                )
                for m in raw["messages"]
            ),
            model=model or None,
            prompt_version=raw["prompt_version"],
            user_confirmed=bool(raw["user_confirmed"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError("unreadable parked run") from exc


def with_texts(run: RunInfo, messages: Sequence[Message]) -> RunInfo:
    """``run`` with its messages' texts (a citation's repair reads them) taken from ``messages``,
    the context's: a parked run keeps none, its request holds them only as the prompt's text. A
    message the context no longer holds stays without: nothing is repaired to or from it."""
    texts = {message_identity(m): message_text(m) for m in messages}
    return replace(
        run, messages=tuple(replace(m, text=texts.get(m.digest, "")) for m in run.messages)
    )


def _said_ms(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


def _said_datetime(value: object) -> datetime | None:
    ms = stored_ms(value)
    return None if ms is None else ms_datetime(ms)


def _turns_sent(data: dict[str, str]) -> int:
    """How many messages a parked run's request carried (0 when its record is unreadable)."""
    try:
        return len(run_from_json(data.get("batch_run", ""), "").messages)
    except ValueError:
        return 0


def park(
    settings: MemqSettings,
    batches: BatchQueue,
    pipeline: ExtractionPipeline,
    context: ConversationContext,
    token: str,
    prepared: Prepared,
    now: int,
    formats: FormatChoice | None = None,
) -> bool:
    """Hand a prepared run to the batch lane; False when its claim was already gone."""
    run = pipeline.run_info(context, prepared, settings.llm_model)
    key = prompt_cache_key(settings.key_prefix, context.user_id, context.agent_name)
    return batches.park(
        context.key.id,
        token,
        request_body(settings, prepared, key, formats),
        prepared.selection.watermark,
        run_to_json(run),
        now,
    )


@dataclass
class CycleReport:
    jobs_created: int = 0
    sent: int = 0
    applied: int = 0
    fallbacks: int = 0
    stale: int = 0
    polled: int = 0


class BatchLane:
    """Gather, poll and settle the batch jobs of every shard (one ``memq.batch`` task)."""

    def __init__(
        self,
        settings: MemqSettings,
        queue: QueueClient,
        batches: BatchQueue,
        pipeline: ExtractionPipeline,
        endpoint: BatchEndpoint,
        *,
        clock: Callable[[], int] = now_ms,
        settlement: Settlement | None = None,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.batches = batches
        self.pipeline = pipeline
        self.endpoint = endpoint
        self.clock = clock
        self._metrics = MetricsRecorder(queue.redis, queue.keys.metrics())
        self.settlement = settlement or Settlement(
            self._metrics,
            TokenBudget.for_settings(settings, queue.redis),
            PriceTable.from_settings(settings),
            clock,
        )

    def cycle(self) -> CycleReport:
        report = CycleReport()
        started = time.monotonic()
        for index, shard in enumerate(self.batches.keys.all_shards()):
            lock = self.batches.lock(shard, BATCH_LOCK_MS)
            if lock is None:
                continue  # another process is on this shard
            try:
                self._sweep_lost(shard, report)
                for batch_id in self.batches.jobs_due(shard, self.clock()):
                    if time.monotonic() - started > BATCH_CYCLE_SECONDS:
                        break
                    self._poll(shard, batch_id, report)
                if time.monotonic() - started <= BATCH_CYCLE_SECONDS:
                    self._gather(shard, index, report)
            finally:
                self.batches.unlock(shard, lock)
        self._metrics.count(
            batch_jobs_created=report.jobs_created,
            batch_requests_sent=report.sent,
            batch_applied=report.applied,
            batch_fallbacks=report.fallbacks,
            batch_stale=report.stale,
        )
        return report

    # --- gathering
    def _gather(self, shard: QueueKeys, index: int, report: CycleReport) -> None:
        parked = self.batches.gather(shard, self.clock())
        if not parked:
            return
        lines = request_lines((item.token, item.request) for item in parked)
        try:
            batch_id = self.endpoint.create(lines, metadata={"memq_shard": str(index)})
        except LLMError as exc:
            # A job that cannot be created is a failed job: the work goes on synchronously.
            log.warning(
                "batch job not created (%s): %d contexts run synchronously", exc, len(parked)
            )
            self._fall_back([OutRequest(p.context_id, p.token) for p in parked], "", report)
            return
        moved = self.batches.submit(shard, batch_id, parked, self.clock())
        report.jobs_created += 1
        report.sent += moved
        log.info("batch job %s created: %d requests", batch_id, moved)
        if moved == 0:
            self._cancel(batch_id)

    # --- polling
    def _poll(self, shard: QueueKeys, batch_id: str, report: CycleReport) -> None:
        report.polled += 1
        try:
            status = self.endpoint.status(batch_id)
        except LLMError as exc:
            log.warning("batch job %s: status unknown (%s); asked again later", batch_id, exc)
            self.batches.poll_later(shard, batch_id, self.clock())
            return
        if status.status not in FINISHED:
            self.batches.poll_later(shard, batch_id, self.clock())
            return
        results: dict[str, RequestResult] = {}
        try:
            for file_id in (status.error_file_id, status.output_file_id):
                if file_id:
                    results.update(
                        read_results(self.endpoint.content(file_id), self.settings.llm_model)
                    )
        except LLMError as exc:
            log.warning("batch job %s: files unreadable (%s); asked again later", batch_id, exc)
            self.batches.poll_later(shard, batch_id, self.clock())
            return
        requests = self.batches.job_requests(shard, batch_id)
        log.info(
            "batch job %s %s: %d answers for %d requests",
            batch_id,
            status.status,
            sum(1 for r in results.values() if r.answer is not None),
            len(requests),
        )
        for request in requests:
            result = results.get(request.token)
            if result is not None and result.answer is not None:
                self._settle(request, batch_id, result.answer, report)
            else:
                reason = result.error if result is not None else f"job {status.status}"
                log.info("batch request of %s: %s; run synchronously", request.context_id, reason)
                self._fall_back([request], batch_id, report)
        self.batches.drop_job(shard, batch_id)
        # The prompts and answers at the provider are of no use any more: delete them (best effort;
        # the provider's own retention removes what a failure here leaves).
        for file_id in (status.input_file_id, status.output_file_id, status.error_file_id):
            if file_id:
                try:
                    self.endpoint.delete_file(file_id)
                except LLMError as exc:
                    log.info("batch job %s: file not deleted (%s)", batch_id, exc)

    def _sweep_lost(self, shard: QueueKeys, report: CycleReport) -> None:
        """Contexts out past their job's window and slack: that job is lost to us."""
        for request, batch_id in self.batches.lost(shard, self.clock()):
            log.warning(
                "batch job %s of %s is past its window: run synchronously",
                batch_id or "-",
                request.context_id,
            )
            self._fall_back([request], batch_id, report)

    # --- settling
    def _settle(
        self, request: OutRequest, batch_id: str, answer: ModelAnswer, report: CycleReport
    ) -> None:
        """Apply one answer under the fence it was parked with, then settle it as a synchronous
        run is settled (:class:`Settlement`: budget, queue, counters, bill, log line)."""
        data, stored = self.queue.load_run(request.context_id)
        current = parked_with(data, request.token)
        covered = data.get("batch_watermark") or None
        usage = usage_of(answer)
        run = AnsweredRun(
            request.context_id,
            _int(data.get("claimed_version")),
            "batch",
            _int(data.get("batch_parked_ms")) or self.clock(),
            trace_id=data.get("trace_id") or None,
            batch_id=batch_id,
        )
        if not current:
            # Superseded (a flush claimed it) or forgotten: the request only leaves the job.
            self.batches.complete(request, batch_id, covered, self.clock())
            applied = stale_report(usage, 0, "its claim moved on while the job was out")
        elif covered is not None and stored == covered:
            # Saved before a crash; only the settlement was missing: not applied again.
            applied = saved_report([], usage, None, covered, False, 0)
        else:
            try:
                context = ConversationContext.from_hash(data)
                applied = self.pipeline.apply_answer(
                    context,
                    answer,
                    with_texts(
                        run_from_json(data.get("batch_run", ""), answer.model), context.messages
                    ),
                    watermark=covered,
                    fence=Fence(request.context_id, request.token),
                )
            except (MemqError, ValueError) as exc:  # e.g. an answer that does not parse
                log.info(
                    "batch answer of %s unusable (%s); run synchronously",
                    request.context_id,
                    type(exc).__name__,
                )
                self._fall_back_one(request, batch_id, report)
                return
        if applied.outcome != "stale":
            applied = replace(applied, messages_sent=_turns_sent(data))
        settled = self.settlement.settle(
            run,
            applied,
            lambda also: self.batches.complete(request, batch_id, covered, self.clock(), also),
        )
        if settled["outcome"] == "stale":
            report.stale += 1
        else:
            report.applied += 1

    def _fall_back(self, requests: list[OutRequest], batch_id: str, report: CycleReport) -> None:
        for request in requests:
            self._fall_back_one(request, batch_id, report)

    def _fall_back_one(self, request: OutRequest, batch_id: str, report: CycleReport) -> None:
        if self.batches.fallback(request, batch_id, self.clock()):
            report.fallbacks += 1
        else:
            report.stale += 1

    def _cancel(self, batch_id: str) -> None:
        try:
            self.endpoint.cancel(batch_id)
        except LLMError as exc:
            log.warning("batch job %s not cancelled: %s", batch_id, exc)
