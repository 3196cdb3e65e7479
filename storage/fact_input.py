"""What a fact typed by hand, or a document imported, must be before management stores it.

Refused, never repaired: a blank or over-long fact, a confidence outside [0, 1], a duplicate the
caller asked to reject, a JSON value that is not a memory document. The fact cap applies to a
hand-added fact as it would to an extracted one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from memq.core.errors import InvalidMemoryData
from storage.base import Change, UpdateResult
from storage.cap import cap_fact_length, evict_over_cap, eviction_change
from storage.document import Fact, MemoryDocument, new_fact_id
from storage.vocabulary import DEFAULT_CATEGORY, content_key, normalise_category, parse_confidence


class DuplicateFact(InvalidMemoryData):
    """``add_fact(..., reject_duplicate=True)``: the same fact (content equal but for case and
    whitespace) is already stored."""


class FactTooLong(InvalidMemoryData):
    """A fact typed by hand is longer than ``fact_max_chars``: refused (a person can shorten it;
    cutting it silently would store something they did not write)."""


def refuse_too_long(fact: Fact, max_chars: int) -> None:
    """Raise :class:`FactTooLong` naming the first field of ``fact`` over ``max_chars``."""
    _, over = cap_fact_length(fact, max_chars)
    if over:
        name = over[0]
        raise FactTooLong(
            f"{name} is {len(getattr(fact, name))} characters, over the limit of {max_chars} "
            "(MEMQ_FACT_MAX_CHARS)"
        )


def valid_content(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidMemoryData("content must be a non-blank string")
    return value.strip()


def valid_confidence(value: object) -> float:
    """A hand-entered confidence: a number in [0, 1]; anything else is refused, not clamped."""
    number = None if isinstance(value, str) else parse_confidence(value, clamp=False)
    if number is None:
        raise InvalidMemoryData(f"confidence must be between 0 and 1, got {value!r:.40}")
    return number


def valid_category(value: object) -> str:
    if value is None:
        return DEFAULT_CATEGORY
    if not isinstance(value, str):
        raise InvalidMemoryData(f"category must be a string, got {value!r:.40}")
    return normalise_category(value)


def parse_import(data: Mapping[str, Any] | str | bytes) -> MemoryDocument:
    """A DeerFlow or memq memory.json (text or parsed) → a validated document.

    Facts without usable content are dropped (as on every read); anything that is not a memory
    document at all is refused, so an import never silently empties someone's memory.
    """
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise InvalidMemoryData(f"not JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise InvalidMemoryData("a memory document must be a JSON object")
    if not any(key in data for key in ("facts", "user", "history")):
        raise InvalidMemoryData("not a memory document: no `facts`, `user` or `history`")
    if "facts" in data and not isinstance(data["facts"], list):
        raise InvalidMemoryData("`facts` must be a list")
    for section in ("user", "history"):
        if section in data and not isinstance(data[section], Mapping):
            raise InvalidMemoryData(f"`{section}` must be an object")
    try:
        document = MemoryDocument.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidMemoryData(f"not a valid memory document: {exc}") from exc
    seen: set[str] = set()
    for fact in document.facts:
        if fact.id in seen:  # two facts with one id would make edit/delete ambiguous
            fact.id = new_fact_id()
        seen.add(fact.id)
    return document


def refuse_unfit_import(
    document: MemoryDocument, entries: int, *, max_facts: int | None, replace: bool
) -> None:
    """Refuse an import that would store more than the fact cap, or empty a memory without being
    asked to (``replace``): ``{"facts": [1, 2]}`` reads as no fact at all. ``entries``: how many
    items the file's ``facts`` list held. One line, and nothing is written."""
    count = len(document.facts)
    if max_facts is not None and count > max_facts:
        raise InvalidMemoryData(
            f"the file holds {count} facts, over the cap of {max_facts} per memory "
            "(MEMQ_MAX_FACTS): nothing imported"
        )
    if count == 0 and not replace:
        held = (
            f"its `facts` holds {entries} entries, none a fact with content"
            if entries
            else ("it holds no fact")
        )
        raise InvalidMemoryData(
            f"no readable fact in the file ({held}): nothing imported; to empty the memory on "
            "purpose, import with replace (`memq import --replace`, `PUT …/memory?replace=true`)"
        )


def refuse_duplicate(document: MemoryDocument, fact: Fact) -> None:
    """Raise :class:`DuplicateFact` when the same fact as ``fact`` is stored."""
    key = content_key(fact.content)
    if any(content_key(f.content) == key for f in document.facts):
        # Not quoted back: an error may travel to logs and clients the content should not.
        raise DuplicateFact("a fact with this content is already stored")


def append_capped(
    document: MemoryDocument, fact: Fact, max_facts: int | None
) -> tuple[UpdateResult, bool]:
    """Append a hand-added ``fact``, then apply the fact cap as an extraction would; the update
    (an ``add`` change unless the cap evicted ``fact`` itself, an ``evict`` per other fact it
    evicted) and whether ``fact`` was kept."""
    document.facts.append(fact)
    evictions: list[Change] = []
    kept = True
    if max_facts is not None:
        document.facts, evicted = evict_over_cap(document.facts, max_facts)
        kept = all(f is not fact for f in evicted)
        evictions = [eviction_change(f, max_facts) for f in evicted if f is not fact]
    changes = (
        [Change(action="add", fact_id=fact.id, content=fact.content, reason="added by hand")]
        if kept
        else []
    )
    changes += evictions
    return UpdateResult(document, changes), kept
