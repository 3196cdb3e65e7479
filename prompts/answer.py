"""The answer the update model must give, and reading it out of whatever the model actually sent.

Models wrap JSON in think tags, prose and code fences, stream it in chunks, or start with a decoy
object; we accept the first JSON object that has all three required keys and never repair
broken JSON. Each field is then normalised on its own, so one bad fact is dropped rather than the
whole answer — except when removals come with malformed new facts: "replace X by Y" must never
degrade into "delete X", so that answer is rejected as a whole (fail closed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from memq.core.errors import ResponseParseError
from memq.memory.blocks import strip_blocks, tag_pattern
from memq.memory.update import (
    ConsolidationProposal,
    NewFact,
    SectionUpdate,
    StaleRemoval,
    UpdateAnswer,
)
from storage.document import (
    CATEGORIES,
    DEFAULT_CATEGORY,
    HISTORY_SECTIONS,
    SECTION_KEYS,
    USER_SECTIONS,
)

REQUIRED_KEYS = ("user", "history", "newFacts")
# Bounds the decoding work on a long answer full of braces, in characters the decoder reads per
# character of the answer: linear in the answer, however many braces (a count of attempts would
# reject a valid answer after a brace-heavy preamble).
_DECODE_WORK_PER_CHAR = 16
_DECODE_WORK_FLOOR = 1_000_000
# Closed reasoning blocks come before the answer and may be full of braces, or of drafts.
_REASONING_BLOCK = tag_pattern(("think", "thinking", "reasoning", "reflection"))
_TRUE_STRINGS = {"true", "yes", "1"}


def response_text(content: Any) -> str:
    """A chat message's content as text: streamed string chunks are joined as they are, text blocks
    each become their own piece, anything else is ignored or stringified."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if not isinstance(content, list):
        return str(content).strip()
    pieces: list[str] = []
    run: list[str] = []
    for item in content:
        if isinstance(item, str):
            run.append(item)
            continue
        if run:
            pieces.append("".join(run))
            run = []
        if isinstance(item, Mapping) and isinstance(item.get("text"), str):
            pieces.append(item["text"])
    if run:
        pieces.append("".join(run))
    return "\n".join(pieces).strip()


def find_update_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` that has every required key, wherever it starts; closed
    reasoning blocks (``<think>…</think>``) are skipped unless nothing outside them is found."""
    without_reasoning = strip_blocks(text, _REASONING_BLOCK, unclosed="keep")
    if without_reasoning != text:
        found = _first_update_object(without_reasoning)
        if found is not None:
            return found
    return _first_update_object(text)


def _first_update_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    budget = _DECODE_WORK_PER_CHAR * len(text) + _DECODE_WORK_FLOOR
    start = text.find("{")
    while start != -1 and budget > 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as error:
            value, end = None, error.pos
        except (ValueError, RecursionError):
            value, end = None, len(text)  # unknown how far it read: assume all of it
        budget -= end - start + 1
        if isinstance(value, dict) and all(key in value for key in REQUIRED_KEYS):
            return value
        start = text.find("{", start + 1)
    return None


def normalise_category(value: Any) -> str | None:
    """One of our six categories, or None. Free text is not kept (DeerFlow kept any string):
    ``Preferences`` and `` preference `` are ``preference``; anything unknown is for the caller
    to default."""
    if not isinstance(value, str) or not value.strip():
        return None
    name = value.strip().casefold()
    if name in CATEGORIES:
        return name
    if name.endswith("s") and name[:-1] in CATEGORIES:
        return name[:-1]
    return None


def _flag(value: Any) -> bool:
    # DeerFlow tested truthiness, so the string "false" meant "update".
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().casefold() in _TRUE_STRINGS
    if isinstance(value, int | float):
        return value == 1
    return False


def _confidence(value: Any, *, missing: float | None) -> float | None:
    """A finite number clamped to [0, 1]; ``missing`` when absent; None (drop) when unusable."""
    if value is None:
        return missing
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return min(1.0, max(0.0, float(value)))


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _sections(data: dict[str, Any]) -> dict[str, SectionUpdate]:
    sections: dict[str, SectionUpdate] = {}
    for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
        block = data.get(group)
        if not isinstance(block, Mapping):
            continue
        for name in names:
            raw = block.get(SECTION_KEYS[name], block.get(name))
            if not isinstance(raw, Mapping):
                continue
            summary = raw.get("summary")
            if not isinstance(summary, str):
                continue
            should = _flag(raw.get("shouldUpdate", raw.get("should_update")))
            sections[name] = SectionUpdate(summary=summary.strip(), should_update=should)
    return sections


def _new_fact(raw: Any) -> NewFact | None:
    if not isinstance(raw, Mapping):
        return None
    content = _text(raw.get("content"))
    # Absent means "inferred" (0.5); an explicit null or a bool is malformed and drops the fact.
    confidence = _confidence(raw["confidence"], missing=None) if "confidence" in raw else 0.5
    if content is None or confidence is None:
        return None
    return NewFact(
        content=content,
        category=normalise_category(raw.get("category")) or DEFAULT_CATEGORY,
        confidence=confidence,
        source_error=_text(raw.get("sourceError", raw.get("source_error"))),
    )


def _removal_ids(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    ids: list[str] = []
    for item in value:
        # Bare ids (the schema we ask for) and DeerFlow HEAD's {"id": …} objects.
        raw = item.get("id") if isinstance(item, Mapping) else item
        text = _text(raw)
        if text is not None and text not in ids:
            ids.append(text)
    return tuple(ids)


def _stale(value: Any) -> tuple[StaleRemoval, ...]:
    if not isinstance(value, list):
        return ()
    removals = []
    for item in value:
        if isinstance(item, Mapping) and (fact_id := _text(item.get("id"))) is not None:
            reason = item.get("reason")
            removals.append(
                StaleRemoval(id=fact_id, reason=reason.strip() if isinstance(reason, str) else "")
            )
    return tuple(removals)


def _consolidations(value: Any) -> tuple[ConsolidationProposal, ...]:
    if not isinstance(value, list):
        return ()
    proposals = []
    for item in value:
        if not isinstance(item, Mapping):
            continue
        raw_ids = item.get("sourceIds", item.get("source_ids"))
        merged = item.get("consolidated")
        if not isinstance(raw_ids, list) or not isinstance(merged, Mapping):
            continue
        ids = tuple(dict.fromkeys(i.strip() for i in raw_ids if isinstance(i, str) and i.strip()))
        content = _text(merged.get("content"))
        if len(ids) < 2 or content is None:
            continue
        proposals.append(
            ConsolidationProposal(
                source_ids=ids,
                content=content,
                category=normalise_category(merged.get("category")),
                confidence=_confidence(merged.get("confidence"), missing=None),
            )
        )
    return tuple(proposals)


def normalise_answer(data: dict[str, Any]) -> UpdateAnswer:
    raw_facts = data.get("newFacts")
    facts: list[NewFact] = []
    dropped = 0
    if isinstance(raw_facts, list):
        for raw in raw_facts:
            fact = _new_fact(raw)
            if fact is None:
                dropped += 1
            else:
                facts.append(fact)
    else:
        dropped = 1
    removals = _removal_ids(data.get("factsToRemove"))
    if removals and dropped:
        raise ResponseParseError(
            f"the answer removes {len(removals)} fact(s) but {dropped} new fact(s) are malformed; "
            "rejected so that a replacement never degrades into a deletion"
        )
    return UpdateAnswer(
        sections=_sections(data),
        new_facts=tuple(facts),
        facts_to_remove=removals,
        stale_facts_to_remove=_stale(data.get("staleFactsToRemove")),
        facts_to_consolidate=_consolidations(data.get("factsToConsolidate")),
        dropped_facts=dropped,
    )


def parse_update_response(content: Any) -> UpdateAnswer:
    """Read an :class:`UpdateAnswer` from a model's content; ResponseParseError if none."""
    text = response_text(content)
    data = find_update_object(text)
    if data is None:
        # Only the answer's shape: this message becomes the dead letter's reason, which
        # `memq dead list` shows, and the answer quotes the user's conversation.
        shape = "a '{' but no object with them decodes" if "{" in text else "no '{' at all"
        raise ResponseParseError(
            f"no JSON object with {', '.join(REQUIRED_KEYS)} in the model's answer "
            f"({len(text)} chars, {shape})"
        )
    return normalise_answer(data)
