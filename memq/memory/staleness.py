"""Staleness review: old facts are shown to the model, which may propose removing some
(the prompt section: ``prompts.review``).

Guardrails, because the model's answer is applied to the *latest* document: only facts that are
candidates there (old enough, not in a protected category, among the oldest shown) can go, and at
most ``staleness_max_removals_per_cycle`` per extraction, lowest confidence first.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from memq.core.settings import MemqSettings
from memq.memory.update import StaleRemoval
from storage.document import Fact, MemoryDocument
from storage.vocabulary import category_set


def stale_candidates(document: MemoryDocument, settings: MemqSettings, now: datetime) -> list[Fact]:
    """Facts said longer ago than the age limit outside protected categories, oldest first, at most
    as many as the prompt may show (the oldest are the likeliest to be obsolete). Age counts from
    when the user said a fact (:meth:`Fact.when_said`), not from when memq learnt it: a
    conversation imported today about last year is last year's."""
    protected = category_set(settings.staleness_protected_categories)
    cutoff = now - timedelta(days=settings.staleness_age_days)
    old = [
        f
        for f in document.facts
        if f.category not in protected and (said := f.when_said()) is not None and said < cutoff
    ]
    old.sort(key=lambda f: f.when_said() or cutoff)
    return old[: settings.staleness_max_candidates_shown]


def should_review(candidates: Sequence[Fact], settings: MemqSettings) -> bool:
    return (
        settings.staleness_review_enabled and len(candidates) >= settings.staleness_min_candidates
    )


def select_stale_removals(
    document: MemoryDocument,
    proposals: Sequence[StaleRemoval],
    settings: MemqSettings,
    now: datetime,
) -> list[tuple[Fact, str]]:
    """The proposed removals that pass the guardrails, with their reasons."""
    if not proposals:
        return []
    allowed = {f.id: f for f in stale_candidates(document, settings, now)}
    chosen: dict[str, tuple[Fact, str]] = {}
    for proposal in proposals:
        fact = allowed.get(proposal.id)
        if fact is not None and fact.id not in chosen:
            chosen[fact.id] = (fact, proposal.reason or "stale")
    ranked = sorted(chosen.values(), key=lambda pair: pair[0].confidence)  # stable on ties
    return ranked[: settings.staleness_max_removals_per_cycle]
