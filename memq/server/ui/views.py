"""What the pages show, as plain functions on the storage's own models: sorting and filtering the
fact table, the provenance of a fact, its history, and which facts a preview left out.

Provenance is the storage's own models (a fact's ``sources``, ``confirmations`` and
``provenance()``, a document's ``superseded`` facts): a document written before they existed
loads with them empty and reads as run-level attribution from its source thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from prompts.injection import render_fact
from storage.base import Change
from storage.document import Fact, MemoryDocument
from storage.sources import Source

# What a redirect after a change may say it did (a fixed vocabulary: nothing from the URL is shown).
NOTICES = {
    "added": "Fact added.",
    "edited": "Fact edited; the change is in its history.",
    "deleted": "Fact deleted; the deletion is in the memory's history.",
    "thread-forgotten": "Thread forgotten.",
}

SortKey = Literal["confidence", "learnt", "category", "confirmations", "content"]
SORT_KEYS: tuple[SortKey, ...] = ("confidence", "learnt", "category", "confirmations", "content")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def confirmations(fact: Fact) -> int:
    return fact.confirmations


def _sort_key(key: SortKey) -> Callable[[Fact], Any]:
    if key == "learnt":
        return lambda f: f.created_at or _EPOCH
    if key == "category":
        return lambda f: (f.category.casefold(), -f.confidence)
    if key == "confirmations":
        return confirmations
    if key == "content":
        return lambda f: f.content.casefold()
    return lambda f: f.confidence


def sort_key(value: str | None) -> SortKey:
    return next((k for k in SORT_KEYS if k == value), "confidence")


def fact_table(
    facts: Iterable[Fact],
    *,
    sort: SortKey = "confidence",
    descending: bool = True,
    category: str | None = None,
    text: str | None = None,
) -> list[Fact]:
    """The facts shown: of ``category`` (all when None), containing ``text`` (case-folded),
    ordered by ``sort``; equal keys keep document order."""
    wanted = (text or "").strip().casefold()
    kept = [
        f
        for f in facts
        if (not category or f.category == category)
        and (not wanted or wanted in f.content.casefold())
    ]
    return sorted(kept, key=_sort_key(sort), reverse=descending)


def sources(fact: Fact) -> list[Source]:
    """Where ``fact`` came from: its recorded sources, or (a document from before sources were
    kept) its source thread as one run-level source — the storage's own reading."""
    return fact.provenance()


@dataclass(frozen=True)
class SupersededView:
    fact: Fact
    kind: str
    at: datetime | None
    replaced_by: tuple[str, ...]
    reason: str
    thread_id: str | None


def superseded(document: MemoryDocument) -> list[SupersededView]:
    """The document's superseded facts, newest first."""
    return [
        SupersededView(
            fact=entry.fact,
            kind=entry.kind,
            at=entry.superseded_at,
            replaced_by=tuple(entry.replaced_by),
            reason=entry.reason,
            thread_id=entry.thread_id,
        )
        for entry in reversed(document.superseded)
    ]


def superseded_by(entries: Sequence[SupersededView], fact_id: str) -> list[SupersededView]:
    """The superseded facts ``fact_id`` replaced."""
    return [e for e in entries if fact_id in e.replaced_by]


def superseded_fact(entries: Sequence[SupersededView], fact_id: str) -> SupersededView | None:
    return next((e for e in entries if e.fact.id == fact_id), None)


def fact_history(changes: Iterable[Change], fact_id: str) -> list[Change]:
    """The history entries about one fact, in the order given (newest first from storage)."""
    return [c for c in changes if c.fact_id == fact_id]


def left_out(facts: Iterable[Fact], block: str) -> list[Fact]:
    """The facts whose line is not in ``block``: the injector's own rendering of a fact
    (:func:`prompts.injection.render_fact`) is looked up among the block's lines, so this says
    what the agent did not get, whatever rule chose it."""
    lines = set(block.splitlines())
    return [f for f in facts if render_fact(f) not in lines]


def categories(facts: Iterable[Fact]) -> list[str]:
    return sorted({f.category for f in facts}, key=str.casefold)
