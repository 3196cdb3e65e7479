"""memq documents in the shape DeerFlow's gateway and web UI parse, and DeerFlow's own inputs
(hidden messages) read for memq. Pure functions: no DeerFlow import."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from storage.document import Fact, MemoryDocument
from storage.sections import HISTORY_SECTIONS, SECTION_KEYS, USER_SECTIONS, Section

DEERFLOW_VERSION = "1.0"


def iso_z(value: datetime | None) -> str:
    """DeerFlow's timestamps: UTC ISO-8601 with a trailing ``Z``; ``""`` when unknown."""
    if value is None:
        return ""
    return value.isoformat().replace("+00:00", "Z")


def deerflow_fact(fact: Fact) -> dict[str, Any]:
    """One fact in DeerFlow's public shape; ``source`` is the thread id, or ``manual``,
    ``consolidation``, ``import``, ``unknown``."""
    thread = fact.source_thread_id or "unknown"
    source = thread if fact.source == "conversation" else fact.source
    out: dict[str, Any] = {
        "id": fact.id,
        "content": fact.content,
        "category": fact.category,
        "confidence": fact.confidence,
        "createdAt": iso_z(fact.created_at),
        "source": source,
    }
    if fact.source_error:
        out["sourceError"] = fact.source_error
    if fact.consolidated_from:
        out["consolidatedAt"] = iso_z(fact.consolidated_at)
        out["consolidatedFrom"] = list(fact.consolidated_from)
    return out


def _section(section: Section) -> dict[str, str]:
    return {"summary": section.summary, "updatedAt": iso_z(section.updated_at)}


def deerflow_document(document: MemoryDocument, *, facts: bool = True) -> dict[str, Any]:
    """The whole document as DeerFlow's ``memory.json`` (``version``, ``lastUpdated``, ``user``,
    ``history``, ``facts``)."""
    return {
        "version": DEERFLOW_VERSION,
        "lastUpdated": iso_z(document.last_updated),
        "user": {SECTION_KEYS[n]: _section(getattr(document.user, n)) for n in USER_SECTIONS},
        "history": {
            SECTION_KEYS[n]: _section(getattr(document.history, n)) for n in HISTORY_SECTIONS
        },
        "facts": [deerflow_fact(f) for f in newest_first(document.facts)] if facts else [],
    }


_UNKNOWN_TIME = datetime.min.replace(tzinfo=UTC)


def newest_first(facts: Iterable[Fact]) -> list[Fact]:
    """Facts as DeerMem returns them and DeerFlow's settings page shows them: newest first by
    when they were said (``Fact.when_said``: a fact from before memq knew goes by when it was
    learnt; one without a time counts as oldest; among equal times, the later-added one first)."""
    ordered = list(enumerate(facts))
    ordered.sort(key=lambda item: (_as_utc(item[1].when_said()), item[0]), reverse=True)
    return [fact for _, fact in ordered]


def _as_utc(value: datetime | None) -> datetime:
    if value is None:
        return _UNKNOWN_TIME
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def with_user_summaries(agent: MemoryDocument, user: MemoryDocument) -> MemoryDocument:
    """The agent's document whose empty summary sections are filled from the user-level
    document: what DeerFlow injects in middleware mode (agent facts + user summaries)."""
    merged = agent.model_copy(deep=True)
    for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
        for name in names:
            mine = getattr(getattr(merged, group), name)
            theirs = getattr(getattr(user, group), name)
            if not mine.summary.strip() and theirs.summary.strip():
                setattr(getattr(merged, group), name, theirs.model_copy())
    return merged


KeepHidden = Callable[[Mapping[str, Any]], bool]


def apply_hidden_filter(messages: Iterable[Any], keep_hidden: KeepHidden | None) -> list[Any]:
    """DeerFlow's ``should_keep_hidden_message`` hook applied before memq's own filter: a hidden
    (``hide_from_ui``) user message the host keeps is passed on un-hidden; one it rejects is
    dropped. Without a hook the list is returned as is (memq's filter keeps only valid
    clarification answers)."""
    items = list(messages)
    if keep_hidden is None:
        return items
    out: list[Any] = []
    for message in items:
        kind = getattr(message, "type", None)
        extra = getattr(message, "additional_kwargs", None)
        if kind == "human" and isinstance(extra, Mapping) and extra.get("hide_from_ui"):
            try:
                keep = bool(keep_hidden(extra))
            except Exception:  # a host hook must not cost the user their turn
                keep = False
            if keep:
                out.append(
                    {
                        "role": "user",
                        "content": getattr(message, "content", ""),
                        "id": getattr(message, "id", None),
                    }
                )
            continue
        out.append(message)
    return out
