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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from memq.core.settings import MemqSettings
from memq.memory.consolidation import apply_consolidations
from memq.memory.scrub import scrub_own_document
from memq.memory.staleness import select_stale_removals
from memq.memory.update import UpdateAnswer
from storage.base import Change, ChangeAction
from storage.cap import cap_fact_length, evict_over_cap, eviction_change
from storage.document import Fact, MemoryDocument, SupersededKind, copy_document
from storage.provenance import RunInfo, add_source, grounded, repaired_citation, supersede
from storage.sections import HISTORY_SECTIONS, USER_SECTIONS, Section
from storage.sources import Source
from storage.vocabulary import CORRECTION, content_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApplyResult:
    document: MemoryDocument
    changes: list[Change]
    refused: int = 0  # new facts refused as not grounded in the user's words
    unknown_removals: int = 0  # ids in factsToRemove that named no fact (ignored)
    repaired: int = 0  # new facts citing only the assistant, re-attributed to the user's message


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


@dataclass
class _Run:
    """One application of an answer: its inputs, and what it displaced and refused so far."""

    doc: MemoryDocument
    answer: UpdateAnswer
    settings: MemqSettings
    now: datetime
    thread_id: str | None
    run: RunInfo | None
    displaced: list[tuple[Fact, SupersededKind, str]] = field(default_factory=list)
    refused: int = 0
    unknown_removals: int = 0
    repaired: int = 0

    def change(self, action: ChangeAction, fact: Fact, reason: str) -> Change:
        return _fact_change(action, fact, reason, self.now, self.thread_id)

    def take_out(self, doomed: dict[str, str], kind: SupersededKind) -> list[Change]:
        """Take the facts named in ``doomed`` (id → why) out of the document; they are kept as
        superseded once the facts replacing them are known (``keep_superseded``)."""
        action: ChangeAction = "stale" if kind == "stale" else "supersede"
        out = [f for f in self.doc.facts if f.id in doomed]
        self.doc.facts = [f for f in self.doc.facts if f.id not in doomed]
        self.displaced += [(f, kind, doomed[f.id]) for f in out]
        return [self.change(action, f, doomed[f.id]) for f in out]


def _remove_contradicted(run: _Run) -> list[Change]:
    """Supersedes the contradicted facts other than corrections; those wait for
    ``_remove_replaced_corrections``, once it is known which replacements were really stored."""
    doomed: dict[str, str] = {}
    for fact_id in run.answer.facts_to_remove:
        fact = run.doc.fact(fact_id)
        if fact is None:
            # A model copying "<fact id>" from the instructions, or a fact another run removed
            # meanwhile: nothing to remove, and counted.
            log.debug("removal of %s skipped: not in the latest document", fact_id)
            run.unknown_removals += 1
        elif fact.category != CORRECTION:
            doomed[fact_id] = "contradicted by the conversation"
    return run.take_out(doomed, "contradicted")


def _remove_replaced_corrections(run: _Run, replacements: list[Fact]) -> list[Change]:
    """Supersedes contradicted corrections, at most one per correction this answer stored (and
    the scrub kept): a duplicate, a scrubbed or a single trivial replacement must not license
    wiping the user's corrections."""
    doc = run.doc
    available = [f for f in replacements if f.category == CORRECTION and doc.fact(f.id) is not None]
    doomed: dict[str, str] = {}
    for fact_id in run.answer.facts_to_remove:
        fact = doc.fact(fact_id)
        if fact is None or fact.category != CORRECTION or fact_id in doomed:
            continue
        if not available:
            log.info("removal of correction fact %s refused: no replacement correction", fact_id)
            continue
        replacement = available.pop(0)
        doomed[fact_id] = f"contradicted by the conversation, replaced by {replacement.id}"
    return run.take_out(doomed, "contradicted")


def _remove_stale(run: _Run) -> list[Change]:
    removals = select_stale_removals(
        run.doc, run.answer.stale_facts_to_remove, run.settings, run.now
    )
    return run.take_out({fact.id: f"stale: {reason}" for fact, reason in removals}, "stale")


def _keep_superseded(run: _Run, added: list[Fact]) -> None:
    """Keep what the answer displaced as superseded; a contradicted fact is replaced by the facts
    this answer added (the stale ones by nothing)."""
    kept = {f.id for f in run.doc.facts}
    replacements = [f.id for f in added if f.id in kept]
    for fact, kind, reason in run.displaced:
        supersede(
            run.doc,
            fact,
            kind=kind,
            reason=reason,
            replaced_by=replacements if kind == "contradicted" else [],
            at=run.now,
            thread_id=run.thread_id,
            max_kept=run.settings.superseded_max_facts,
        )


_REPAIRED = "; its citation of the assistant moved to the user's message"


def _grounded_source(
    run: _Run, cites: Sequence[str], content: str
) -> tuple[Source | None, str] | None:
    """The source of a new fact citing ``cites`` (None without a run) and what to add to its
    change's reason; None when the fact is not grounded in the user's words and its citation
    cannot be repaired (:func:`repaired_citation`; a repaired source is the user's message, so
    its excerpt and time are the user's)."""
    if run.run is None:
        return None, ""
    source = run.run.source_for(cites)
    if grounded(
        source,
        user_confirmed=run.run.user_confirmed,
        require_user=run.settings.grounding_requires_user,
    ):
        return source, ""
    label = repaired_citation(run.run, content, cites)
    if label is None:
        return None
    run.repaired += 1
    return run.run.source_for([label]), _REPAIRED


def _add_facts(run: _Run) -> tuple[list[Change], list[Fact]]:
    """Store the answer's new facts; one already stored gains a source and a confirmation; one
    not grounded in the user's words is refused unless its citation is repaired."""
    settings = run.settings
    by_key = {content_key(f.content): f for f in run.doc.facts}
    # What a person told memq never to learn again: refused whatever the model says.
    blocked = {content_key(b.content) for b in run.doc.do_not_learn}
    changes = []
    added = []
    for new in run.answer.new_facts:
        if new.confidence < settings.fact_confidence_threshold:
            continue
        if content_key(new.content) in blocked:
            continue
        grounding = _grounded_source(run, new.cites, new.content)
        if grounding is None:
            run.refused += 1
            continue
        source, repair = grounding
        fact, cut = _capped(
            Fact(
                content=new.content,
                category=new.category,
                confidence=new.confidence,
                created_at=run.now,
                source="conversation",
                source_thread_id=run.thread_id,
                source_error=new.source_error,
                sources=[] if source is None else [source],
                said_at=None if source is None else source.said_at,
                event_date=new.event_date,
            ),
            settings,
        )
        # Keyed after the cut: the same long fact proposed again matches the stored, cut one.
        key = content_key(fact.content)
        known = by_key.get(key)
        if known is not None:
            if source is not None and add_source(known, source, settings.fact_max_sources):
                changes.append(run.change("confirm", known, f"learnt again ({source.attribution})"))
            continue
        by_key[key] = fact
        run.doc.facts.append(fact)
        added.append(fact)
        reason = f"{fact.category}, confidence {fact.confidence:.2f}" + cut + repair
        changes.append(run.change("add", fact, reason))
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
    doc, changes = scrub_own_document(doc, source_thread_id=thread_id)  # doc: apply's own copy
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
    run: RunInfo | None = None,
) -> ApplyResult:
    """A new document with ``answer`` applied (the input is not modified), and its changes.

    With ``run`` each new fact keeps its source (the messages it cites, or the whole run) and is
    held to the grounding rule; without it (hand-made answers) facts only name ``thread_id``.
    """
    return apply_to_own(
        copy_document(document),
        answer,
        settings=settings,
        now=now,
        thread_id=thread_id,
        run=run,
    )


def apply_to_own(
    doc: MemoryDocument,
    answer: UpdateAnswer,
    *,
    settings: MemqSettings,
    now: datetime,
    thread_id: str | None = None,
    run: RunInfo | None = None,
) -> ApplyResult:
    """:func:`apply_update` on a document the caller owns — a storage ``update`` callback's
    argument is one — changed in place instead of copied first: a copy of a document of a few
    hundred facts is a good part of an extraction's own CPU."""
    state = _Run(doc, answer, settings, now, thread_id, run)
    changes = _apply_sections(doc, answer, now, thread_id)
    changes += _remove_contradicted(state)
    changes += _remove_stale(state)
    added_changes, added = _add_facts(state)
    changes += added_changes
    # Scrubbed before corrections are removed, so that a replacement the scrub drops replaces
    # nothing; the final scrub below catches what the merges bring in.
    state.doc, scrubbed = _scrub(state.doc, now, thread_id)
    changes += scrubbed
    changes += _remove_replaced_corrections(state, added)
    _keep_superseded(state, added)
    doc = state.doc
    doc.facts, evicted = evict_over_cap(doc.facts, settings.max_facts)
    changes += [
        eviction_change(f, settings.max_facts, at=now, thread_id=thread_id) for f in evicted
    ]
    # After the cap, so that a merge never names a source the cap just evicted.
    if settings.consolidation_enabled:
        changes += _consolidate(doc, answer, settings, now, thread_id)
    doc, scrubbed = _scrub(doc, now, thread_id)
    changes += scrubbed
    if changes:
        doc.last_updated = now
    return ApplyResult(
        doc,
        changes,
        refused=state.refused,
        unknown_removals=state.unknown_removals,
        repaired=state.repaired,
    )
