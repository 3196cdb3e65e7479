"""Everything the worker does with one claimed conversation, from prompt to updated memory.

``extract_update`` is the whole algorithm on plain data (context + memory in, memory + changes +
usage out) for callers without storage. ``ExtractionPipeline`` adds storage: it builds the prompt
from a snapshot, calls the model with no lock held (the call takes seconds and other threads of the
same user would queue behind it), and applies the answer to the *latest* document inside the
storage's atomic ``update``, so a concurrent extraction of another thread is never overwritten.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from core.models import ConversationContext
from core.settings import MemqSettings
from prompts.answer import UpdateAnswer, parse_update_response
from prompts.apply import apply_update
from prompts.conversation import TokenCounter, select_messages
from prompts.tokens import make_token_counter
from prompts.update_prompt import UpdatePrompt, build_update_prompt
from storage.base import Change, MemoryStorage, UpdateResult
from storage.document import MemoryDocument, utc_now
from worker.llm import UpdateModel

log = logging.getLogger(__name__)

Outcome = Literal["updated", "unchanged", "skipped"]
Clock = Callable[[], datetime]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    attempts: int = 0


@dataclass(frozen=True)
class ExtractionReport:
    outcome: Outcome
    facts_added: int = 0
    facts_removed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_ms: int = 0
    changes: list[Change] = field(default_factory=list)
    model: str = ""
    messages_sent: int = 0
    messages_dropped: int = 0
    reason: str = ""


def _count(changes: list[Change], *actions: str) -> int:
    return sum(1 for c in changes if c.action in actions)


def propose_update(
    context: ConversationContext,
    memory: MemoryDocument,
    settings: MemqSettings,
    model: UpdateModel,
    *,
    now: datetime,
    count_tokens: TokenCounter,
) -> tuple[UpdatePrompt | None, UpdateAnswer | None, Usage]:
    """Prompt → model → parsed answer; (None, None, empty usage) when there is nothing to send.

    Raises TransientLLMError / PermanentLLMError from the model, ResponseParseError from parsing.
    """
    selected, _watermark = select_messages(context.messages, None, settings.context_messages)
    prompt = build_update_prompt(
        memory,
        selected,
        settings=settings,
        now=now,
        count_tokens=count_tokens,
        correction=context.correction,
        reinforcement=context.reinforcement,
    )
    if prompt is None:
        return None, None, Usage()
    answer = model.propose(prompt)
    usage = Usage(answer.prompt_tokens, answer.completion_tokens, answer.model, answer.attempts)
    return prompt, parse_update_response(answer.text), usage


def extract_update(
    context: ConversationContext,
    memory: MemoryDocument,
    settings: MemqSettings,
    model: UpdateModel,
    *,
    now: datetime,
    count_tokens: TokenCounter,
) -> tuple[MemoryDocument, list[Change], Usage]:
    """The updated memory, what changed and what it cost; ``memory`` itself is never modified."""
    _prompt, answer, usage = propose_update(
        context, memory, settings, model, now=now, count_tokens=count_tokens
    )
    if answer is None:
        return memory, [], usage
    result = apply_update(memory, answer, settings=settings, now=now, thread_id=context.thread_id)
    return result.document, result.changes, usage


class ExtractionPipeline:
    def __init__(
        self,
        settings: MemqSettings,
        storage: MemoryStorage,
        model: UpdateModel,
        *,
        count_tokens: TokenCounter | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._settings = settings
        self._storage = storage
        self._model = model
        self._count_tokens = count_tokens or make_token_counter(settings.token_counting)
        self._clock = clock or utc_now

    def run(self, context: ConversationContext) -> ExtractionReport:
        """Extract one context into its (user, agent) memory.

        Raises TransientLLMError (retry), PermanentLLMError, ResponseParseError — the memory is
        untouched in every one of those cases.
        """
        started = time.monotonic()

        def elapsed_ms() -> int:
            return int((time.monotonic() - started) * 1000)

        if not context.messages:
            return ExtractionReport("skipped", duration_ms=elapsed_ms(), reason="no messages")
        snapshot = self._storage.load(context.user_id, context.agent_name)
        prompt, answer, usage = propose_update(
            context,
            snapshot,
            self._settings,
            self._model,
            now=self._clock(),
            count_tokens=self._count_tokens,
        )
        if prompt is None or answer is None:
            return ExtractionReport(
                "skipped", duration_ms=elapsed_ms(), reason="blank conversation"
            )
        changes: list[Change] = []
        if not answer.is_noop():
            changes = self._apply(context, answer)
        report = ExtractionReport(
            outcome="updated" if changes else "unchanged",
            facts_added=_count(changes, "add", "merge"),
            facts_removed=_count(changes, "remove", "stale", "evict"),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            duration_ms=elapsed_ms(),
            changes=changes,
            model=usage.model,
            messages_sent=len(prompt.conversation),
            messages_dropped=prompt.messages_dropped,
        )
        log.info(
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
        return report

    def _apply(self, context: ConversationContext, answer: UpdateAnswer) -> list[Change]:
        latest_changes: list[Change] = []

        def fn(latest: MemoryDocument) -> UpdateResult:
            # May run again on a write conflict: keep only the changes of the run that was saved.
            result = apply_update(
                latest,
                answer,
                settings=self._settings,
                now=self._clock(),
                thread_id=context.thread_id,
            )
            latest_changes[:] = result.changes
            return UpdateResult(result.document, result.changes)

        self._storage.update(context.user_id, context.agent_name, fn)
        return latest_changes
