"""What one extraction run reports: the tokens it spent (``Usage``) and how it ended
(``ExtractionReport``), read by the task body's settlement, its counters and its log line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from storage.base import Change
from worker.model import ModelAnswer

Outcome = Literal["updated", "unchanged", "skipped", "stale"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    attempts: int = 0
    cached_tokens: int = 0
    service_tier: str = ""


@dataclass(frozen=True)
class ExtractionReport:
    outcome: Outcome
    facts_added: int = 0
    facts_removed: int = 0
    facts_invalid: int = 0  # new facts of the answer that did not validate (dropped)
    facts_refused: int = 0  # new facts refused as not grounded in the user's words
    citations_repaired: int = 0  # new facts citing only the assistant, moved to the user's message
    answers_missing_fields: int = 0  # 1 when the answer left out a list or a summary group
    removals_unknown: int = 0  # removal ids that named no fact of the memory (ignored)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, read from the provider's prompt cache
    service_tier: str = ""
    duration_ms: int = 0
    changes: list[Change] = field(default_factory=list)
    model: str = ""
    messages_sent: int = 0
    messages_dropped: int = 0
    earlier_shown: int = 0
    reason: str = ""
    watermark: str | None = None  # store it on completion (None: leave the stored one)
    more: bool = False  # only the oldest chunk of the new messages was extracted: run again now


def answer_counts(report: ExtractionReport) -> dict[str, int]:
    """What a saved answer adds to the counters of its shape (memq.core.metrics.COUNTERS), as
    the one settlement of both lanes records it."""
    return {
        "facts_invalid": report.facts_invalid,
        "facts_refused": report.facts_refused,
        "citations_repaired": report.citations_repaired,
        "answers_missing_fields": report.answers_missing_fields,
        "removals_unknown": report.removals_unknown,
    }


def usage_of(answer: ModelAnswer) -> Usage:
    return Usage(
        answer.prompt_tokens,
        answer.completion_tokens,
        answer.model,
        answer.attempts,
        answer.cached_tokens,
        answer.service_tier,
    )
