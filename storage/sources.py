"""Where a fact came from: one :class:`Source` per time an extraction learnt it.

A source names the thread, the messages (their watermark identities: fixed-length digests of
their ids or text), the roles among those messages, for a message-level citation a short excerpt
of each cited message (what an operator reads to see where the fact came from; forgetting the
thread removes the source and its excerpts with it), the extraction run, when, the model and the
prompt version. ``attribution`` says how exact it is: ``message`` when the model cited the
messages the fact came from, ``run`` when it did not (or cited wrongly) and the source falls back
to every new message of its run — never a guessed message. Facts written before sources existed
read as run-level from their source thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from storage.vocabulary import parse_timestamp

Role = Literal["user", "assistant"]
Attribution = Literal["message", "run"]
# Messages one source names at most (the newest of its run): a run-level source of a long
# conversation must not grow a fact without bound.
MAX_SOURCE_MESSAGES = 16
# A cited message's excerpt: enough to recognise the message, bounded so a fact's sources stay
# small (at most MAX_SOURCE_EXCERPTS of them per source, the first cited messages').
MAX_EXCERPT_CHARS = 200
MAX_SOURCE_EXCERPTS = 4
Excerpt = Annotated[str, Field(max_length=MAX_EXCERPT_CHARS)]


def _text_or_none(value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    return value.strip() if isinstance(value, str) and value.strip() else None


class Source(BaseModel):
    """One time a fact was learnt (immutable: sources are shared between document copies)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    thread_id: str | None = None
    messages: tuple[str, ...] = Field(default=(), max_length=MAX_SOURCE_MESSAGES)
    # Who said ``messages``: each role among them once, in order of appearance (what grounding
    # asks: did the user say it?).
    roles: tuple[Role, ...] = Field(default=(), max_length=2)
    attribution: Attribution = "run"
    # Message-level citations only: ``excerpts[i]`` is the start of ``messages[i]``, as stored
    # (invisible characters dropped, tag-like openings neutralised, one line).
    excerpts: tuple[Excerpt, ...] = Field(default=(), max_length=MAX_SOURCE_EXCERPTS)
    run_id: str | None = None
    at: AwareDatetime | None = None
    model: str | None = None
    prompt_version: str | None = None
    # When the messages were said (the earliest of them; the hand-off time for a message that
    # carried none), apart from ``at``, when memq learnt it. None in sources written before.
    said_at: AwareDatetime | None = None


def repaired_source(data: Any) -> Source:
    """A source read field by field from what a hand or an older writer left: bad fields get
    their defaults, lists are cut to their bound, naive times read as UTC. Sources memq wrote
    validate as they are, without this (the fast path of every document load)."""
    if isinstance(data, Source):
        return data
    if not isinstance(data, Mapping):
        raise ValueError("a source is an object")
    return Source.model_validate(_repaired(data))


def _repaired(data: Mapping[str, Any]) -> dict[str, Any]:
    messages = data.get("messages")
    roles = data.get("roles")
    message_level = data.get("attribution") == "message"
    excerpts = [e[:MAX_EXCERPT_CHARS] for e in _items(data.get("excerpts")) if isinstance(e, str)]
    return {
        "thread_id": _text_or_none(data.get("thread_id")),
        "messages": tuple(m for m in _items(messages) if isinstance(m, str) and m)[
            -MAX_SOURCE_MESSAGES:
        ],
        "roles": tuple(dict.fromkeys(r for r in _items(roles) if r in ("user", "assistant"))),
        "attribution": "message" if message_level else "run",
        "excerpts": tuple(excerpts[:MAX_SOURCE_EXCERPTS]) if message_level else (),
        "run_id": _text_or_none(data.get("run_id")),
        "at": parse_timestamp(data.get("at")),
        "model": _text_or_none(data.get("model")),
        "prompt_version": _text_or_none(data.get("prompt_version")),
        "said_at": parse_timestamp(data.get("said_at")),
    }


def _items(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, list | tuple) else ()
