"""Reading the update model's answer out of whatever the model actually sent, the answer's
schema block as the prompt shows it, and its JSON schema as an endpoint's structured outputs
take it — all from the one answer model, ``memq.memory.update``.

Models wrap JSON in think tags, prose and code fences, stream it in chunks, or start with a decoy
object; we accept the first JSON object that has all three required keys, else the first that
holds keys of an answer, each of its kind (a small model leaves lists out: an absent list means
"none", and the answer says which it left out), and never repair broken JSON. The answer model
then validates it item by item, so one bad fact is dropped rather than the whole answer — except
when removals come with malformed new facts: "replace X by Y" must never degrade into "delete X",
so that answer is rejected as a whole (fail closed).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from memq.core.errors import ResponseParseError
from memq.memory.blocks import strip_blocks, tag_pattern
from memq.memory.update import (
    ANSWER_KEYS,
    REQUIRED_KEYS,
    ConsolidationProposal,
    NewFact,
    SectionUpdate,
    StaleRemoval,
    UpdateAnswer,
    partial_answer,
)
from storage.sections import HISTORY_SECTIONS, USER_SECTIONS

# Bounds the decoding work on a long answer full of braces, in characters the decoder reads per
# character of the answer: linear in the answer, however many braces (a count of attempts would
# reject a valid answer after a brace-heavy preamble).
_DECODE_WORK_PER_CHAR = 16
_DECODE_WORK_FLOOR = 1_000_000
# Closed reasoning blocks come before the answer and may be full of braces, or of drafts.
_REASONING_BLOCK = tag_pattern(("think", "thinking", "reasoning", "reflection"))
_SCHEMA_LINE_CHARS = 60  # a list in the schema block longer than this gets one item per line


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
    """The first JSON object in ``text`` that has every required key, wherever it starts, else
    the first that is a partial answer; closed reasoning blocks (``<think>…</think>``) are
    skipped unless nothing outside them is found."""
    without_reasoning = strip_blocks(text, _REASONING_BLOCK, unclosed="keep")
    if without_reasoning != text:
        found = _first_update_object(without_reasoning)
        if found is not None:
            return found
    return _first_update_object(text)


def _first_update_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    budget = _DECODE_WORK_PER_CHAR * len(text) + _DECODE_WORK_FLOOR
    partial: dict[str, Any] | None = None
    start = text.find("{")
    while start != -1 and budget > 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as error:
            value, end = None, error.pos
        except (ValueError, RecursionError):
            value, end = None, len(text)  # unknown how far it read: assume all of it
        budget -= end - start + 1
        if isinstance(value, dict):
            if all(key in value for key in REQUIRED_KEYS):
                return value
            if partial is None and partial_answer(value):
                partial = value
        start = text.find("{", start + 1)
    return partial


def normalise_answer(data: Mapping[str, Any]) -> UpdateAnswer:
    """Validate a decoded answer; ResponseParseError when it removes facts while one of its new
    facts is malformed (fail closed: "replace X by Y" must never become "delete X")."""
    answer = UpdateAnswer.from_wire(data)
    if answer.facts_to_remove and answer.dropped_facts:
        raise ResponseParseError(
            f"the answer removes {len(answer.facts_to_remove)} fact(s) but "
            f"{answer.dropped_facts} new fact(s) are malformed; rejected so that a replacement "
            "never degrades into a deletion"
        )
    return answer


def parse_update_response(content: Any) -> UpdateAnswer:
    """Read an :class:`UpdateAnswer` from a model's content; ResponseParseError if none."""
    text = response_text(content)
    data = find_update_object(text)
    if data is None:
        # Only the answer's shape: this message becomes the dead letter's reason, which
        # `memq dead list` shows, and the answer quotes the user's conversation.
        shape = "a '{' but no object with them decodes" if "{" in text else "no '{' at all"
        raise ResponseParseError(
            f"no JSON object with any of {', '.join(ANSWER_KEYS)} in the model's answer "
            f"({len(text)} chars, {shape})"
        )
    return normalise_answer(data)


def _schema_example() -> UpdateAnswer:
    """The answer the prompt shows as its schema: every field, with placeholders (built without
    validation: the placeholders are not valid values)."""
    section = SectionUpdate.model_construct(summary="...", should_update=False)
    return UpdateAnswer.model_construct(
        sections=dict.fromkeys((*USER_SECTIONS, *HISTORY_SECTIONS), section),
        new_facts=(
            NewFact.model_construct(
                content="...",
                category="preference",
                confidence=0.9,
                source_error="...",
                cites=("m1",),
                event_date="YYYY-MM-DD",
            ),
        ),
        facts_to_remove=("<fact id>",),
        stale_facts_to_remove=(StaleRemoval.model_construct(id="<fact id>", reason="..."),),
        facts_to_consolidate=(
            ConsolidationProposal.model_construct(
                source_ids=("<fact id>", "<other fact id>"),
                content="...",
                category="preference",
                confidence=0.9,
            ),
        ),
    )


def _render_schema_value(value: Any) -> str:
    """Objects one entry per line, long lists one item per line, anything else on one line."""
    if isinstance(value, dict):
        entries = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()]
        return "{\n" + ",\n".join(entries) + "\n  }"
    compact = json.dumps(value)
    if isinstance(value, list) and len(compact) > _SCHEMA_LINE_CHARS:
        return "[\n" + ",\n".join(f"    {json.dumps(item)}" for item in value) + "\n  ]"
    return compact


def render_answer_schema() -> str:
    """The JSON shape the prompt asks for, rendered from the answer model."""
    wire = _schema_example().to_wire()
    entries = [f"  {json.dumps(key)}: {_render_schema_value(value)}" for key, value in wire.items()]
    return "{\n" + ",\n".join(entries) + "\n}"


# What a strict structured-output schema may not carry: names and docs (tokens for nothing), and
# defaults and bounds, which OpenAI's strict mode refuses or ignores; the answer model still
# enforces the bounds when it reads the answer.
_UNSENT_KEYWORDS = frozenset(
    {"title", "description", "default", "minLength", "maxLength", "minimum", "maximum"}
)


def _strict(node: Any) -> Any:
    """``node`` in the strict form: every object closed (``additionalProperties: false``) with
    every property required (an optional one is nullable or has a value the model can always
    write), minus the keywords strict mode does not take."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    strict: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "$defs"):  # maps of names: the names are not keywords
            strict[key] = {name: _strict(schema) for name, schema in value.items()}
        elif key not in _UNSENT_KEYWORDS:
            strict[key] = _strict(value)
    if "properties" in strict:
        strict["required"] = list(strict["properties"])
        strict["additionalProperties"] = False
    return strict


@functools.cache
def _answer_json_schema() -> str:
    generated = UpdateAnswer.model_json_schema(by_alias=True, mode="serialization")
    return json.dumps(_strict(generated))


def answer_json_schema() -> dict[str, Any]:
    """The JSON schema of an answer as structured outputs take it, generated from the answer
    model in the strict form (OpenAI's: all properties required, objects closed), a fresh copy
    each call."""
    schema: dict[str, Any] = json.loads(_answer_json_schema())
    return schema
