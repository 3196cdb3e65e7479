"""Everything the worker does with one claimed conversation, from prompt to updated memory.

``ExtractionPipeline`` builds the prompt from a snapshot of the memory, calls the model with no
lock held (the call takes seconds and other threads of the same user would queue behind it), and
applies the answer to the *latest* document inside the storage's atomic ``update``, so a
concurrent extraction of another thread is never overwritten.

Extraction is incremental: only the messages after the thread's watermark are sent (with a few
earlier ones as context), the correction/reinforcement signals are detected on that new part, and
the report carries the watermark the caller stores once the run is settled. A new part larger than
the conversation budget is extracted in chunks, oldest first: the report's ``more`` asks the caller
to have the context run again at once for the rest.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from memq.core.errors import MemqError, StaleClaim
from memq.core.identity import ContextKey
from memq.core.models import ConversationContext
from memq.core.settings import MemqSettings
from memq.core.timestamps import ms_datetime
from memq.memory.apply import apply_to_own
from memq.memory.signals import signals_in
from memq.memory.update import UpdateAnswer
from prompts.answer import parse_update_response
from prompts.conversation import message_excerpt, message_text
from prompts.tokens import TokenCounter, make_token_counter
from prompts.update_prompt import PROMPT_VERSION, UpdatePrompt, build_update_prompt
from storage.base import Change, Fence, MemoryStorage, PendingRead, PipelinedReads, UpdateResult
from storage.document import MemoryDocument, utc_now
from storage.provenance import RunInfo, RunMessage
from worker.cost import prompt_cache_key
from worker.gates import Gate
from worker.model import ModelAnswer, UpdateModel
from worker.report import ExtractionReport, Usage, usage_of
from worker.watermark import ChunkBudget, Selection, message_identity, split_at_watermark

if TYPE_CHECKING:
    from worker.embeddings import FactEmbedding

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def _count(changes: list[Change], *actions: str) -> int:
    return sum(1 for c in changes if c.action in actions)


def chunk_budget(settings: MemqSettings, count_tokens: TokenCounter) -> ChunkBudget:
    """The new conversation one run may send: what the update prompt's budget holds."""
    return ChunkBudget(settings.conversation_max_tokens, settings.message_max_chars, count_tokens)


def prompt_for(
    selection: Selection,
    memory: MemoryDocument,
    settings: MemqSettings,
    *,
    now: datetime,
    count_tokens: TokenCounter,
) -> UpdatePrompt | None:
    """The prompt for the new part of a conversation (signals detected on that part alone), with
    the earlier messages shown as context only; None when there is nothing to send."""
    correction, reinforcement = signals_in(selection.new)
    return build_update_prompt(
        memory,
        selection.new,
        settings=settings,
        now=now,
        count_tokens=count_tokens,
        correction=correction,
        reinforcement=reinforcement,
        earlier=selection.context,
    )


@dataclass(frozen=True)
class Prepared:
    """A run ready for the model: the prompt, and the selection of messages it covers."""

    prompt: UpdatePrompt
    selection: Selection


class ExtractionPipeline:
    def __init__(
        self,
        settings: MemqSettings,
        storage: MemoryStorage,
        model: UpdateModel,
        *,
        count_tokens: TokenCounter | None = None,
        clock: Clock | None = None,
        embedding: FactEmbedding | None = None,
    ) -> None:
        self._settings = settings
        # Embeds the facts a saved run added or edited (worker/embeddings.py); None: no model.
        self._embedding = embedding
        self._storage = storage
        self._model = model
        self._count_tokens = count_tokens or make_token_counter(settings.token_counting)
        self._clock = clock or utc_now

    def pending_memory(self, context_id: str) -> PendingRead | None:
        """The read of the memory a run of ``context_id`` extracts into, to send with the run's
        first round trip and hand to :meth:`run` (None: the storage reads only by itself, or
        the id names no user)."""
        if not isinstance(self._storage, PipelinedReads):
            return None
        try:
            key = ContextKey.from_id(context_id)
        except MemqError:
            return None
        return self._storage.pending_read(key.user_id, key.agent_name)

    def run(
        self,
        context: ConversationContext,
        *,
        watermark: str | None = None,
        fence: Fence | None = None,
        gate: Gate | None = None,
        memory: PendingRead | None = None,
    ) -> ExtractionReport:
        """Extract the messages of one context after ``watermark`` into its (user, agent) memory.

        Nothing new (a re-delivered task, a flush of a thread already extracted) is "skipped"
        without calling the model; the report's watermark is still set, so the caller completes
        the context as usual. Raises TransientLLMError (retry), PermanentLLMError,
        ResponseParseError — the memory is untouched in every one of those cases.

        With ``fence`` (the worker's claim), the save is refused once that claim is no longer
        current: the report is then "stale", the answer discarded, its token usage still counted.
        ``memory``: :meth:`pending_memory` of the context, sent with the run's first round trip.
        """
        elapsed_ms = _stopwatch()
        step = self.prepare(context, watermark=watermark, fence=fence, memory=memory)
        if isinstance(step, ExtractionReport):
            return step
        report = self.finish(context, step, fence=fence, gate=gate)
        return replace(report, duration_ms=elapsed_ms())

    def prepare(
        self,
        context: ConversationContext,
        *,
        watermark: str | None = None,
        fence: Fence | None = None,
        memory: PendingRead | None = None,
    ) -> Prepared | ExtractionReport:
        """Everything before the model call: the messages after ``watermark`` and the prompt for
        them from a snapshot of the memory (``memory``: that read, already sent); a report
        instead when there is nothing to send or the claim is already gone. The batch lane sends
        the prompt later and hands the answer to :meth:`apply_answer`, as :meth:`finish` does
        at once."""
        elapsed_ms = _stopwatch()
        if not context.messages:
            return ExtractionReport("skipped", duration_ms=elapsed_ms(), reason="no messages")
        selection = self._select(context, watermark)
        if not selection.new:
            return ExtractionReport(
                "skipped",
                duration_ms=elapsed_ms(),
                reason="nothing new since the last extraction",
                watermark=selection.watermark,
            )
        if fence is not None:
            try:
                self._storage.fence_run(context.user_id, context.agent_name, fence)
            except StaleClaim as exc:
                return ExtractionReport("stale", duration_ms=elapsed_ms(), reason=str(exc))
        if memory is not None and (memory.user_id, memory.agent_name) == (
            context.user_id,
            context.agent_name,
        ):
            snapshot = memory.document()
        else:
            snapshot = self._storage.load(context.user_id, context.agent_name)
        prompt = prompt_for(
            selection,
            snapshot,
            self._settings,
            now=self._clock(),
            count_tokens=self._count_tokens,
        )
        if prompt is None:
            # The new part is blank: nothing to learn from it, and nothing to send again.
            return ExtractionReport(
                "skipped",
                duration_ms=elapsed_ms(),
                reason="blank conversation",
                watermark=selection.watermark,
                more=selection.more,
            )
        return Prepared(prompt, selection)

    def run_info(self, context: ConversationContext, step: Prepared, model: str) -> RunInfo:
        """What the sources of the facts a prepared run learns will say about it."""
        return run_info(context, step.selection, step.prompt, Usage(model=model), self._clock())

    def finish(
        self,
        context: ConversationContext,
        step: Prepared,
        *,
        fence: Fence | None = None,
        gate: Gate | None = None,
    ) -> ExtractionReport:
        """The model call for a prepared run, then its fenced apply. ``gate`` is told the
        prompt's tokens before the call and may raise RunDeferred (a budget, the shared rate
        limit): the memory is then untouched."""
        prompt = step.prompt
        if gate is not None:
            gate(self._count_tokens(prompt.system) + self._count_tokens(prompt.user))
        answer = self._model.propose(
            prompt,
            cache_key=prompt_cache_key(
                self._settings.key_prefix, context.user_id, context.agent_name
            ),
        )
        return self.apply_answer(
            context,
            answer,
            self.run_info(context, step, answer.model),
            watermark=step.selection.watermark,
            more=step.selection.more,
            fence=fence,
            prompt=step.prompt,
        )

    def apply_answer(
        self,
        context: ConversationContext,
        answer: ModelAnswer,
        run: RunInfo,
        *,
        watermark: str | None,
        more: bool = False,
        fence: Fence | None = None,
        prompt: UpdatePrompt | None = None,
    ) -> ExtractionReport:
        """Parse the model's answer and apply it to the *latest* document, its facts' sources
        from ``run``, fenced by ``fence`` with ``watermark`` (what the prompt covered) saved
        beside it. Raises ResponseParseError; a fence that refuses the save makes the report
        "stale" (nothing written)."""
        elapsed_ms = _stopwatch()
        usage = usage_of(answer)
        parsed = parse_update_response(answer.text)
        refused: list[int] = [0, 0, 0]  # facts refused, removals of unknown ids, citations repaired
        try:
            saving = None if fence is None else replace(fence, watermark=watermark)
            changes = [] if parsed.is_noop() else self._apply(context, parsed, run, saving, refused)
        except StaleClaim as exc:
            return stale_report(usage, elapsed_ms(), str(exc))
        if changes and self._embedding is not None:
            # After the fenced save, both lanes (the batch lane settles through here too).
            self._embedding.after_save(self._storage, context.user_id, context.agent_name)
        report = saved_report(changes, usage, prompt, watermark, more, elapsed_ms())
        report = replace(
            report,
            facts_invalid=parsed.dropped_facts,
            facts_refused=refused[0],
            answers_missing_fields=1 if parsed.missing_fields else 0,
            removals_unknown=refused[1],
            citations_repaired=refused[2],
        )
        _log_extracted(context, report)
        return report

    def _select(self, context: ConversationContext, watermark: str | None) -> Selection:
        """The messages after ``watermark`` this run extracts (the oldest chunk that fits the
        budget), and the earlier ones shown as context."""
        selection = split_at_watermark(
            context.messages,
            watermark,
            self._settings.context_messages,
            chunk_budget(self._settings, self._count_tokens),
        )
        if selection.more:
            log.info(
                "%s: %d new messages fit the budget of %d tokens; the rest is extracted next",
                context.key.describe(),
                len(selection.new),
                self._settings.conversation_max_tokens,
            )
        if not selection.new:
            log.info("nothing new in %s since its last extraction", context.key.describe())
        return selection

    def _apply(
        self,
        context: ConversationContext,
        answer: UpdateAnswer,
        run: RunInfo,
        fence: Fence | None,
        refused: list[int],
    ) -> list[Change]:
        latest_changes: list[Change] = []

        def fn(latest: MemoryDocument) -> UpdateResult:
            # May run again on a write conflict: keep only the changes of the run that was saved.
            # `latest` is the storage's private copy for this callback: applied in place.
            result = apply_to_own(
                latest,
                answer,
                settings=self._settings,
                now=self._clock(),
                thread_id=context.thread_id,
                run=run,
            )
            latest_changes[:] = result.changes
            refused[:] = [result.refused, result.unknown_removals, result.repaired]
            return UpdateResult(result.document, result.changes)

        self._storage.update(context.user_id, context.agent_name, fn, fence=fence)
        return latest_changes


def run_info(
    context: ConversationContext,
    selection: Selection,
    prompt: UpdatePrompt,
    usage: Usage,
    now: datetime,
) -> RunInfo:
    """What the sources of the facts this run learns say about it: the labelled new messages
    (by their watermark identity — a digest, never text), the run id, the model and the prompt
    version. The prompt sends the newest of the new messages that have text, each maybe cut: the
    identity is the uncut message's, the one the watermark knows it by; the text (for a citation's
    repair, never stored) is the uncut message's too."""
    sent = [m for m in selection.new if message_text(m)][-len(prompt.conversation) :]
    messages = tuple(
        RunMessage(
            label,
            message_identity(m),
            m.role,
            message_excerpt(m),
            None if m.at is None else ms_datetime(m.at),
            message_text(m),
        )
        for m, label in zip(sent, prompt.labels, strict=True)
    )
    return RunInfo(
        thread_id=context.thread_id,
        run_id=uuid.uuid4().hex[:12],
        at=now,
        messages=messages,
        model=usage.model or None,
        prompt_version=PROMPT_VERSION,
        user_confirmed=prompt.reinforcement,
    )


def _stopwatch() -> Callable[[], int]:
    """Milliseconds since this call, each time the returned function is called."""
    started = time.monotonic()
    return lambda: int((time.monotonic() - started) * 1000)


def stale_report(usage: Usage, duration_ms: int, reason: str) -> ExtractionReport:
    """The save was fenced off: the answer is discarded, its tokens were spent all the same."""
    return ExtractionReport(
        "stale",
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens,
        service_tier=usage.service_tier,
        duration_ms=duration_ms,
        model=usage.model,
        reason=reason,
    )


def saved_report(
    changes: list[Change],
    usage: Usage,
    prompt: UpdatePrompt | None,
    watermark: str | None,
    more: bool,
    duration_ms: int,
) -> ExtractionReport:
    """The report of a run whose answer was applied (or was a no-op)."""
    return ExtractionReport(
        outcome="updated" if changes else "unchanged",
        facts_added=_count(changes, "add", "merge"),
        facts_removed=_count(changes, "remove", "supersede", "stale", "evict"),
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens,
        service_tier=usage.service_tier,
        duration_ms=duration_ms,
        changes=changes,
        model=usage.model,
        messages_sent=len(prompt.conversation) if prompt is not None else 0,
        messages_dropped=prompt.messages_dropped if prompt is not None else 0,
        earlier_shown=prompt.earlier_shown if prompt is not None else 0,
        watermark=watermark,
        more=more,
    )


def _log_extracted(context: ConversationContext, report: ExtractionReport) -> None:
    # The worker logs the one structured line per extraction; this one is for debugging.
    log.debug(
        "extracted %s: %s (+%d -%d facts, %d+%d tokens, %d ms, trace=%s)",
        context.key.describe(),
        report.outcome,
        report.facts_added,
        report.facts_removed,
        report.prompt_tokens,
        report.completion_tokens,
        report.duration_ms,
        context.trace_id or "-",
    )
