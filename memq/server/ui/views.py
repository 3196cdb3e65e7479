"""What the pages show, as plain functions on the storage's own models: sorting and filtering the
fact table, the provenance of a fact, its history, and which facts a preview left out.

Provenance is the storage's own models (a fact's ``sources``, ``confirmations`` and
``provenance()``, a document's ``superseded`` facts): a document written before they existed
loads with them empty and reads as run-level attribution from its source thread.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, Literal, TypeVar

from memq.core.errors import InvalidMemoryData
from storage.base import Change
from storage.document import Fact, MemoryDocument
from storage.sources import Source


def N_(message: str) -> str:
    """Marks a string for the message catalogue (``make i18n`` extracts it from this module);
    the page translates it where it is shown."""
    return message


# What a redirect after a change may say it did (a fixed vocabulary: nothing from the URL is shown).
NOTICES = {
    "added": N_("Fact added."),
    "edited": N_("Fact edited; the change is in its history."),
    "deleted": N_("Fact deleted; the deletion is in the memory's history."),
    "thread-forgotten": N_("Thread forgotten: what it taught is gone."),
    "thread-unknown": N_("Unknown thread: memq held nothing from it, so nothing was forgotten."),
    "forgotten": N_("Fact deleted and put on the do-not-learn list: it will not be learnt again."),
    "blocked": N_("Added to the do-not-learn list."),
    "unblocked": N_("Taken off the do-not-learn list: it may be learnt again."),
    "summary-edited": N_("Summary edited; the change is in the history."),
    "restored": N_("Fact restored; it is current again and the restore is in its history."),
    "imported": N_("Memory replaced by the imported file; the import is in the history."),
    "imported-cut": N_(
        "Memory replaced by the imported file; facts over the length limit were cut to it."
    ),
}

T = TypeVar("T")
# Rows of one page: a 1,000-fact memory is twenty pages, each a few tens of kilobytes.
PAGE_SIZE = 50
Key = tuple[str | float | int, ...]

SortKey = Literal["confidence", "learnt", "category", "confirmations", "content"]
SORT_KEYS: tuple[SortKey, ...] = ("confidence", "learnt", "category", "confirmations", "content")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def confirmations(fact: Fact) -> int:
    return fact.confirmations


def _sort_key(key: SortKey) -> Callable[[Fact], Key]:
    """A total order per column: the column's value, then the fact id (so a cursor names one
    place in the order, whatever facts are added or removed around it)."""
    if key == "learnt":
        return lambda f: ((f.created_at or _EPOCH).isoformat(), f.id)
    if key == "category":
        return lambda f: (f.category.casefold(), -f.confidence, f.id)
    if key == "confirmations":
        return lambda f: (f.confirmations, f.id)
    if key == "content":
        return lambda f: (f.content.casefold(), f.id)
    return lambda f: (f.confidence, f.id)


def sort_key(value: str | None) -> SortKey:
    return next((k for k in SORT_KEYS if k == value), "confidence")


@dataclass(frozen=True)
class Paged(Generic[T]):
    """One page of an ordered list: its rows, the cursor of the next page (None: the last),
    where it starts (0-based) and how many rows there are in all."""

    rows: list[T]
    next: str | None
    start: int
    total: int


BAD_CURSOR = "this page link is not valid (start from the first page)"


def encode_cursor(key: Key) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Key:
    """The key a cursor names; a cursor that is not one of ours is one clear error."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError):
        raise InvalidMemoryData(BAD_CURSOR) from None
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise InvalidMemoryData(BAD_CURSOR)
    return tuple(value)


def paged(
    items: Iterable[T],
    key: Callable[[T], Key],
    *,
    descending: bool = False,
    after: str | None = None,
    limit: int = PAGE_SIZE,
) -> Paged[T]:
    """The ``limit`` items that follow the cursor ``after`` in ``key`` order (the first page when
    None). A stable cursor: the key of the last row shown, not an offset, so rows added or removed
    meanwhile neither repeat nor skip a row on the next page."""
    ordered = sorted(items, key=key, reverse=descending)
    keys = [key(item) for item in ordered]
    start = 0
    if after:
        mark = decode_cursor(after)
        try:
            start = next(i for i, k in enumerate(keys) if (k < mark if descending else k > mark))
        except TypeError:  # a cursor of another column's order
            raise InvalidMemoryData(BAD_CURSOR) from None
        except StopIteration:
            start = len(ordered)
    rows = ordered[start : start + limit]
    following = encode_cursor(keys[start + limit - 1]) if start + limit < len(ordered) else None
    return Paged(rows, following, start, len(ordered))


def fact_table(
    facts: Iterable[Fact],
    *,
    sort: SortKey = "confidence",
    descending: bool = True,
    category: str | None = None,
    after: str | None = None,
    limit: int = PAGE_SIZE,
) -> Paged[Fact]:
    """A page of the facts of ``category`` (all when None) in ``sort`` order."""
    kept = [f for f in facts if not category or f.category == category]
    return paged(kept, _sort_key(sort), descending=descending, after=after, limit=limit)


def change_key(change: Change) -> Key:
    return (change.at.isoformat(), change.action, change.fact_id or "", change.section or "")


def history_page(changes: Iterable[Change], after: str | None) -> Paged[Change]:
    """A page of the history, newest first."""
    return paged(changes, change_key, descending=True, after=after)


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


def superseded_page(entries: Iterable[SupersededView], after: str | None) -> Paged[SupersededView]:
    """A page of the superseded facts, newest first."""
    return paged(
        entries,
        lambda e: ((e.at or _EPOCH).isoformat(), e.fact.id),
        descending=True,
        after=after,
    )


def superseded_by(entries: Sequence[SupersededView], fact_id: str) -> list[SupersededView]:
    """The superseded facts ``fact_id`` replaced."""
    return [e for e in entries if fact_id in e.replaced_by]


def superseded_fact(entries: Sequence[SupersededView], fact_id: str) -> SupersededView | None:
    return next((e for e in entries if e.fact.id == fact_id), None)


def fact_history(changes: Iterable[Change], fact_id: str) -> list[Change]:
    """The history entries about one fact, in the order given (newest first from storage)."""
    return [c for c in changes if c.fact_id == fact_id]


def deleted(changes: Iterable[Change], fact_id: str) -> Change | None:
    """The newest removal by hand of ``fact_id`` that kept the fact (so it can be restored)."""
    return next(
        (
            c
            for c in changes
            if c.action == "remove" and c.fact is not None and c.fact_id == fact_id
        ),
        None,
    )


def edits(changes: Iterable[Change]) -> list[Change]:
    """A fact's edits by hand that changed its wording, newest first: after one, the fact's
    sources are those of an earlier wording."""
    return [
        c
        for c in changes
        if c.action == "edit" and any(f.field == "content" for f in c.changed or ())
    ]


@dataclass
class ThreadRow:
    """One conversation as a user's memories know it: the facts it taught (current ones whose
    sources name it), in which memories, and when its messages were said."""

    thread_id: str
    facts: list[Fact]
    agents: list[str | None]
    first: datetime | None = None
    last: datetime | None = None


def threads(documents: Sequence[tuple[str | None, MemoryDocument]]) -> list[ThreadRow]:
    """The threads the facts' sources name, the most recently active first."""
    rows: dict[str, ThreadRow] = {}
    for agent, document in documents:
        for fact in document.facts:
            for source in fact.provenance():
                if source.thread_id is None:
                    continue
                row = rows.setdefault(source.thread_id, ThreadRow(source.thread_id, [], []))
                if fact not in row.facts:
                    row.facts.append(fact)
                if agent not in row.agents:
                    row.agents.append(agent)
                if source.at is not None:
                    row.first = min(row.first or source.at, source.at)
                    row.last = max(row.last or source.at, source.at)
    return sorted(
        rows.values(), key=lambda r: ((r.last or _EPOCH).isoformat(), r.thread_id), reverse=True
    )


# Facts each memory shows in the all-memories view: the best few, side by side; a memory's own page
# has the rest.
PER_MEMORY = 20


@dataclass(frozen=True)
class MemoryColumn:
    """One memory of a user in the all-memories view: its agent (None: the user-global memory),
    the facts shown (the best by confidence, or the search's best matches) and how many it
    holds."""

    agent: str | None
    facts: list[Fact]
    total: int


def categories(facts: Iterable[Fact]) -> list[str]:
    return sorted({f.category for f in facts}, key=str.casefold)
