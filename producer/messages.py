"""Which messages of a thread reach the memory LLM, and how many of them.

The producer receives the whole message list of a thread after every agent run. Only user inputs and
final assistant answers carry facts about the user; framework-injected messages, tool traffic and
upload payloads must never reach the memory LLM, nor recalled memory an agent echoes (it would
otherwise feed back into memory): :mod:`memq.memory.blocks` strips both, in one linear pass over
each message after it is cut to the size cap. Messages arrive as OpenAI-style dicts or as
LangChain message objects, which are duck-typed so that LangChain stays an optional dependency.

A message may say when it was said: ``created_at`` (or ``timestamp``, ``createdAt``) on a dict,
or in the ``additional_kwargs`` / ``response_metadata`` of a dict or a LangChain message (where
DeerFlow's and LangChain's own messages keep such metadata). It is read by
:func:`memq.core.timestamps.timestamp_ms`; an unreadable one is dropped (the worker takes the
hand-off time instead) and counted in a :class:`TimeTally`, never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from memq.core.errors import InvalidMessages
from memq.core.models import Message, Role
from memq.core.timestamps import timestamp_ms
from memq.memory.blocks import strip_blocks

log = logging.getLogger(__name__)

# OpenAI roles and LangChain types mapped to the two kinds memory keeps; anything else is dropped.
_HUMAN = "human"
_AI = "ai"
_KINDS: dict[str, str] = {
    "user": _HUMAN,
    "human": _HUMAN,
    "HumanMessageChunk": _HUMAN,
    "assistant": _AI,
    "ai": _AI,
    "AIMessageChunk": _AI,
}
_NO_EXTRA: Mapping[str, Any] = {}
# Where a message's time may be, first found wins: its own keys (created_at, timestamp,
# createdAt: ``_first_time``), then its metadata's.
_METADATA = ("additional_kwargs", "response_metadata")
_TIMED = frozenset(("created_at", "timestamp", "createdAt", *_METADATA))
# Every key a rule below reads besides role (or type), content and id. A dict with none of them
# (the common OpenAI message) needs no rule but the role's and the text's: one set check.
_RULE_KEYS = frozenset(
    ("tool_calls", "function_call", "hidden", "hide_from_ui", "human_input_response", *_TIMED)
)

# A filtered message as the hot path carries it: role, text, id, said-at (epoch ms). A tuple,
# not a Message: building frozen dataclasses cost as much as the rest of the filtering.
Row: TypeAlias = tuple[Role, str, str | None, int | None]


@dataclass(slots=True)
class TimeTally:
    """Message times that could not be read, in one filtering pass (counted by the caller)."""

    dropped: int = 0


def content_text(content: object) -> str:
    """A message's text: strings as they are, list parts joined by one space (strings and the
    ``text`` of dict parts; images and other parts carry no text)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        pieces: list[str] = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, Mapping):
                text = part.get("text")
                if isinstance(text, str):
                    pieces.append(text)
        return " ".join(pieces)
    raise InvalidMessages(
        f"message content must be a string or a list, got {type(content).__name__}"
    )


def is_valid_human_input_response(value: object) -> bool:
    """A clarification answer that the user really gave (and that memory therefore keeps)."""
    if not isinstance(value, Mapping):
        return False
    version = value.get("version")
    if isinstance(version, bool) or version != 1 or value.get("kind") != "human_input_response":
        return False
    if not all(_non_blank(value.get(name)) for name in ("source", "request_id", "value")):
        return False
    kind = value.get("response_kind")
    if kind == "text":
        return True
    return kind == "option" and _non_blank(value.get("option_id"))


def _non_blank(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _extra(item: Any, is_map: bool) -> Mapping[str, Any]:
    extra = item.get("additional_kwargs") if is_map else getattr(item, "additional_kwargs", None)
    if extra is None:  # the common case for OpenAI dicts; skips an ABC isinstance check
        return _NO_EXTRA
    return extra if isinstance(extra, Mapping) else _NO_EXTRA


def _said_at(item: Any, is_map: bool, tally: TimeTally | None) -> int | None:
    """When the message says it was said (epoch ms), or None: absent or unreadable. Plain
    lookups, no generator: this runs for every message of every hand-off."""
    if is_map and _TIMED.isdisjoint(item):
        return None  # the common case: a plain {role, content} dict
    raw: object = _first_time(item) if is_map else None
    if raw is None:
        for name in _METADATA:
            meta = item.get(name) if is_map else getattr(item, name, None)
            if meta and isinstance(meta, Mapping):
                raw = _first_time(meta)
                if raw is not None:
                    break
    if raw is None:
        return None
    ms = timestamp_ms(raw)
    if ms is None and tally is not None:
        tally.dropped += 1
    return ms


def _first_time(fields: Mapping[str, Any]) -> object:
    raw = fields.get("created_at")
    if raw is None:
        raw = fields.get("timestamp")
        if raw is None:
            raw = fields.get("createdAt")
    return raw


def _has_tool_calls(item: Any, is_map: bool) -> bool:
    if not is_map:
        return bool(getattr(item, "tool_calls", None))
    return bool(
        item.get("tool_calls") or item.get("function_call") or _extra(item, True).get("tool_calls")
    )


def _is_hidden(item: Any, is_map: bool) -> bool:
    if is_map and (item.get("hidden") or item.get("hide_from_ui")):
        return True
    return bool(_extra(item, is_map).get("hide_from_ui"))


def _human_input(item: Any, is_map: bool) -> object:
    if is_map and "human_input_response" in item:
        return item["human_input_response"]
    return _extra(item, is_map).get("human_input_response")


def memory_text(content: object, max_chars: int | None = None) -> tuple[str, bool]:
    """A message's text as memory may see it, and whether blocks were stripped from it.

    Cut to its last ``max_chars`` first, so no pattern ever runs over more than the cap; then the
    upload and recalled-memory blocks go."""
    if (
        type(content) is str
        and "<" not in content
        and (max_chars is None or len(content) <= max_chars)
    ):
        return content, False  # the common message: nothing to cut, no tag to strip
    text = content_text(content)
    head_cut = max_chars is not None and len(text) > max_chars
    if head_cut:
        text = text[len(text) - max_chars :] if max_chars else ""
    stripped = strip_blocks(text, head_cut=head_cut)
    if stripped == text:
        return text, False
    return stripped.strip(), True


def filter_messages_for_memory(
    raw: Iterable[object], *, max_chars: int | None = None, tally: TimeTally | None = None
) -> list[Message]:
    """User inputs and final assistant answers, in order, as plain-text :class:`Message` objects,
    each at most ``max_chars`` long (its tail), with the time each says it was said (unreadable
    times counted in ``tally``): :func:`memory_rows` as messages."""
    return [Message(*row) for row in memory_rows(raw, max_chars=max_chars, tally=tally)]


def memory_rows(
    raw: Iterable[object], *, max_chars: int | None = None, tally: TimeTally | None = None
) -> list[Row]:
    """The messages memory keeps (:func:`filter_messages_for_memory`) as :data:`Row` tuples.

    One pass with one flag: the assistant's reply to a turn that was nothing but uploads or
    recalled memory is dropped with it; an answer that was nothing but echoed memory is dropped.
    Raises :class:`InvalidMessages` for anything that is not a list of messages.
    """
    if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Iterable):
        raise InvalidMessages(f"messages must be a list, got {type(raw).__name__}")
    kept: list[Row] = []
    skip_next_ai = False
    item: Any
    for item in raw:
        # Fields are read only when the rule at hand needs them: this runs on every agent turn,
        # over the whole thread. A plain dict carries none of the fields the rules look at.
        if type(item) is dict:
            is_map, plain = True, _RULE_KEYS.isdisjoint(item)
        else:
            is_map, plain = isinstance(item, Mapping), False
        if is_map:
            role = item.get("role") or item.get("type")
        else:
            role = getattr(item, "type", None)
            if not hasattr(item, "content"):
                role = None
        if type(role) is not str:
            raise InvalidMessages(
                "a message must be a dict with a string `role` or an object with `.type` and "
                f"`.content`, got {item!r:.80}"
            )
        kind = _KINDS.get(role)
        if kind is None:
            continue  # tool results, system prompts, …
        content, mid = (
            (item.get("content"), item.get("id"))
            if is_map
            else (item.content, getattr(item, "id", None))
        )
        if type(mid) is not str:
            mid = None
        if kind == _AI:
            if not plain and _has_tool_calls(item, is_map):
                continue  # an intermediate tool-calling step, whatever text it has
            if skip_next_ai:
                skip_next_ai = False
                continue
            text, stripped = memory_text(content, max_chars)
            if stripped and not text:
                continue  # nothing but an echo of recalled memory
            kept.append(("assistant", text, mid, None if plain else _said_at(item, is_map, tally)))
            continue
        if (
            not plain
            and _is_hidden(item, is_map)
            and not is_valid_human_input_response(_human_input(item, is_map))
        ):
            continue  # framework-injected; does not touch skip_next_ai
        text, stripped = memory_text(content, max_chars)
        if stripped and not text:
            skip_next_ai = True  # upload-only turn: its reply says nothing about the user
            continue
        skip_next_ai = False
        kept.append(("user", text, mid, None if plain else _said_at(item, is_map, tally)))
    return kept


def has_minimum_dialogue(messages: Iterable[Message]) -> bool:
    """At least one user and one assistant message: anything less teaches nothing about the user."""
    return _both_roles({message.role for message in messages})


def rows_have_dialogue(rows: Iterable[Row]) -> bool:
    """:func:`has_minimum_dialogue` of :func:`memory_rows`."""
    return _both_roles({row[0] for row in rows})


def _both_roles(roles: set[str]) -> bool:
    return "user" in roles and "assistant" in roles
