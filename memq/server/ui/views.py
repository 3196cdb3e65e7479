"""What the pages show, as plain functions on the storage's own models: sorting and filtering the
fact table, the provenance of a fact, its history, and which facts a preview left out.

Provenance fields (a fact's ``sources`` and ``confirmations``, a document's ``superseded`` facts)
are read with ``getattr`` and defaults: documents and models from before they existed show what
they have (the source thread, the history) and the page works the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from prompts.injection import render_fact
from storage.base import Change
from storage.document import Fact, MemoryDocument

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


def confirmations(fact: Any) -> int:
    value = getattr(fact, "confirmations", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


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


@dataclass(frozen=True)
class SourceView:
    """One line of a fact's provenance."""

    thread_id: str | None
    messages: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    attribution: str = "thread"
    run_id: str | None = None
    at: datetime | None = None
    model: str | None = None
    prompt_version: str | None = None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        return ()
    return tuple(v for v in value if isinstance(v, str))


def sources(fact: Any) -> list[SourceView]:
    """Where ``fact`` came from: its recorded sources, or its source thread alone when the
    document predates them."""
    recorded = getattr(fact, "sources", None)
    if isinstance(recorded, list | tuple) and recorded:
        return [
            SourceView(
                thread_id=_text(getattr(s, "thread_id", None)),
                messages=_strings(getattr(s, "messages", ())),
                roles=_strings(getattr(s, "roles", ())),
                attribution=_text(getattr(s, "attribution", None)) or "run",
                run_id=_text(getattr(s, "run_id", None)),
                at=getattr(s, "at", None) if isinstance(getattr(s, "at", None), datetime) else None,
                model=_text(getattr(s, "model", None)),
                prompt_version=_text(getattr(s, "prompt_version", None)),
            )
            for s in recorded
        ]
    thread = _text(getattr(fact, "source_thread_id", None))
    return [SourceView(thread_id=thread)] if thread is not None else []


@dataclass(frozen=True)
class SupersededView:
    fact: Fact
    kind: str
    at: datetime | None
    replaced_by: tuple[str, ...]
    reason: str
    thread_id: str | None


def superseded(document: MemoryDocument) -> list[SupersededView]:
    """The document's superseded facts, newest first ([] before they were kept)."""
    out: list[SupersededView] = []
    for entry in getattr(document, "superseded", None) or []:
        fact = getattr(entry, "fact", None)
        if not isinstance(fact, Fact):
            continue
        at = getattr(entry, "superseded_at", None)
        out.append(
            SupersededView(
                fact=fact,
                kind=_text(getattr(entry, "kind", None)) or "superseded",
                at=at if isinstance(at, datetime) else None,
                replaced_by=_strings(getattr(entry, "replaced_by", ())),
                reason=_text(getattr(entry, "reason", None)) or "",
                thread_id=_text(getattr(entry, "thread_id", None)),
            )
        )
    return out[::-1]


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
