"""Applying a parsed answer to a memory document — a pure function of the document, the
answer, the settings and ``now``.

It runs inside the storage's atomic ``update`` on the *latest* document, which may differ from the
snapshot the prompt showed: removals of ids that vanished meanwhile are no-ops, dedup is against
what is there now. Differences from DeerFlow, each fixing one of its weaknesses: a contradiction
cannot delete a ``correction`` fact unless the same answer stores a replacement correction (one
removal per replacement actually added and kept by the upload scrub); the cap
evicts any other category before a correction; dedup ignores case *and* whitespace; every change is
recorded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from memq.core.settings import MemqSettings
from memq.memory.consolidation import apply_consolidations
from memq.memory.scrub import scrub_document
from memq.memory.staleness import select_stale_removals
from memq.memory.update import UpdateAnswer
from storage.base import Change, ChangeAction
from storage.cap import cap_fact_length, evict_over_cap
from storage.document import (
    CORRECTION,
    HISTORY_SECTIONS,
    USER_SECTIONS,
    Fact,
    MemoryDocument,
    Section,
    copy_document,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApplyResult:
    document: MemoryDocument
    changes: list[Change]


def content_key(content: str) -> str:
    """Two facts are the same fact when they differ only in case or whitespace."""
    return " ".join(content.split()).casefold()


def _apply_sections(
    doc: MemoryDocument, answer: UpdateAnswer, now: datetime, thread_id: str | None
) -> list[Change]:
    changes = []
    for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
        container = getattr(doc, group)
        for name in names:
            update = answer.sections.get(name)
            if update is None or not update.should_update or not update.summary:
                continue
            if getattr(container, name).summary == update.summary:
                continue
            setattr(container, name, Section(summary=update.summary, updated_at=now))
            changes.append(
                Change(
                    at=now,
                    action="summary",
                    section=name,
                    content=update.summary,
                    reason="updated from the conversation",
                    source_thread_id=thread_id,
                )
            )
    return changes


def _remove_contradicted(
    doc: MemoryDocument, answer: UpdateAnswer, now: datetime, thread_id: str | None
) -> list[Change]:
    """Removes the contradicted facts other than corrections; those wait for
    ``_remove_replaced_corrections``, once it is known which replacements were really stored."""
    doomed: set[str] = set()
    for fact_id in answer.facts_to_remove:
        fact = doc.fact(fact_id)
        if fact is None:
            log.debug("removal of %s skipped: not in the latest document", fact_id)
        elif fact.category != CORRECTION:
            doomed.add(fact_id)
    return _drop(doc, dict.fromkeys(doomed, "contradicted by the conversation"), now, thread_id)


def _remove_replaced_corrections(
    doc: MemoryDocument,
    answer: UpdateAnswer,
    replacements: list[Fact],
    now: datetime,
    thread_id: str | None,
) -> list[Change]:
    """Removes contradicted corrections, at most one per correction this answer stored (and the
    scrub kept): a duplicate, a scrubbed or a single trivial replacement must not license wiping
    the user's corrections."""
    available = [f for f in replacements if f.category == CORRECTION and doc.fact(f.id) is not None]
    doomed: dict[str, Fact] = {}
    for fact_id in answer.facts_to_remove:
        fact = doc.fact(fact_id)
        if fact is None or fact.category != CORRECTION or fact_id in doomed:
            continue
        if not available:
            log.info("removal of correction fact %s refused: no replacement correction", fact_id)
            continue
        doomed[fact_id] = available.pop(0)
    reasons = {
        fact_id: f"contradicted by the conversation, replaced by {replacement.id}"
        for fact_id, replacement in doomed.items()
    }
    return _drop(doc, reasons, now, thread_id)


def _drop(
    doc: MemoryDocument, reasons: dict[str, str], now: datetime, thread_id: str | None
) -> list[Change]:
    """Remove the facts named in ``reasons`` (fact id → why) and record each removal."""
    changes = [
        _fact_change("remove", f, reasons[f.id], now, thread_id)
        for f in doc.facts
        if f.id in reasons
    ]
    doc.facts = [f for f in doc.facts if f.id not in reasons]
    return changes


def _remove_stale(
    doc: MemoryDocument,
    answer: UpdateAnswer,
    settings: MemqSettings,
    now: datetime,
    thread_id: str | None,
) -> list[Change]:
    removals = select_stale_removals(doc, answer.stale_facts_to_remove, settings, now)
    doomed = {fact.id for fact, _ in removals}
    doc.facts = [f for f in doc.facts if f.id not in doomed]
    return [
        _fact_change("stale", fact, f"stale: {reason}", now, thread_id) for fact, reason in removals
    ]


def _add_facts(
    doc: MemoryDocument,
    answer: UpdateAnswer,
    settings: MemqSettings,
    now: datetime,
    thread_id: str | None,
) -> tuple[list[Change], list[Fact]]:
    seen = {content_key(f.content) for f in doc.facts}
    changes = []
    added = []
    for new in answer.new_facts:
        if new.confidence < settings.fact_confidence_threshold:
            continue
        fact, cut = _capped(
            Fact(
                content=new.content,
                category=new.category,
                confidence=new.confidence,
                created_at=now,
                source="conversation",
                source_thread_id=thread_id,
                source_error=new.source_error,
            ),
            settings,
        )
        # Keyed after the cut: the same long fact proposed again matches the stored, cut one.
        key = content_key(fact.content)
        if key in seen:
            continue
        seen.add(key)
        doc.facts.append(fact)
        added.append(fact)
        reason = f"{fact.category}, confidence {fact.confidence:.2f}" + cut
        changes.append(_fact_change("add", fact, reason, now, thread_id))
    return changes, added


def _capped(fact: Fact, settings: MemqSettings) -> tuple[Fact, str]:
    """``fact`` held to ``fact_max_chars``, and what to add to its change's reason."""
    capped, over = cap_fact_length(fact, settings.fact_max_chars)
    if not over:
        return fact, ""
    log.info(
        "a new fact's %s was over fact_max_chars and cut to %d characters",
        " and ".join(over),
        settings.fact_max_chars,
    )
    return capped, f"; {', '.join(over)} cut to {settings.fact_max_chars} characters"


def _consolidate(
    doc: MemoryDocument,
    answer: UpdateAnswer,
    settings: MemqSettings,
    now: datetime,
    thread_id: str | None,
) -> list[Change]:
    result = apply_consolidations(doc, answer.facts_to_consolidate, settings, now)
    if not result.merged:
        return []
    changes = [
        _fact_change("remove", f, f"merged into {result.consumed[f.id]}", now, thread_id)
        for f in doc.facts
        if f.id in result.consumed
    ]
    merged = [_capped(m, settings)[0] for m in result.merged]
    doc.facts = [f for f in doc.facts if f.id not in result.consumed] + merged
    changes += [
        _fact_change("merge", m, "merged from " + ", ".join(m.consolidated_from), now, thread_id)
        for m in merged
    ]
    return changes


def _fact_change(
    action: ChangeAction, fact: Fact, reason: str, now: datetime, thread_id: str | None
) -> Change:
    """The history entry for one fact that this update added, removed, merged or evicted."""
    return Change(
        at=now,
        action=action,
        fact_id=fact.id,
        content=fact.content,
        reason=reason,
        source_thread_id=thread_id,
    )


def _scrub(
    doc: MemoryDocument, now: datetime, thread_id: str | None
) -> tuple[MemoryDocument, list[Change]]:
    doc, changes = scrub_document(doc, source_thread_id=thread_id)
    for change in changes:
        change.at = now
    return doc, changes


def apply_update(
    document: MemoryDocument,
    answer: UpdateAnswer,
    *,
    settings: MemqSettings,
    now: datetime,
    thread_id: str | None = None,
) -> ApplyResult:
    """A new document with ``answer`` applied (the input is not modified), and its changes."""
    doc = copy_document(document)
    changes = _apply_sections(doc, answer, now, thread_id)
    changes += _remove_contradicted(doc, answer, now, thread_id)
    changes += _remove_stale(doc, answer, settings, now, thread_id)
    added_changes, added = _add_facts(doc, answer, settings, now, thread_id)
    changes += added_changes
    # Scrubbed before corrections are removed, so that a replacement the scrub drops replaces
    # nothing; the final scrub below catches what the merges bring in.
    doc, scrubbed = _scrub(doc, now, thread_id)
    changes += scrubbed
    changes += _remove_replaced_corrections(doc, answer, added, now, thread_id)
    doc.facts, evicted = evict_over_cap(doc.facts, settings.max_facts)
    changes += [
        _fact_change(
            "evict",
            f,
            f"over max_facts={settings.max_facts}, lowest confidence ({f.confidence:.2f})",
            now,
            thread_id,
        )
        for f in evicted
    ]
    # After the cap, so that a merge never names a source the cap just evicted.
    if settings.consolidation_enabled:
        changes += _consolidate(doc, answer, settings, now, thread_id)
    doc, scrubbed = _scrub(doc, now, thread_id)
    changes += scrubbed
    if changes:
        doc.last_updated = now
    return ApplyResult(doc, changes)
