"""Where a fact came from: one :class:`Source` per time an extraction learnt it.

A source names the thread, the messages (fixed-length digests, never their text), the roles of
those messages, the extraction run, when, the model and the prompt version. ``attribution`` says
how exact it is: ``message`` when the model cited the messages the fact came from, ``run`` when it
did not (or cited wrongly) and the source falls back to every new message of its run — never a
guessed message. Facts written before sources existed read as run-level from their source thread.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from storage.vocabulary import parse_timestamp

Role = Literal["user", "assistant"]
Attribution = Literal["message", "run"]
# Digests of the messages a source names: enough to tell a thread's messages apart, and fixed in
# length whatever an application uses as message ids.
MESSAGE_DIGEST_BYTES = 8
# Messages one source names at most (the newest of its run): a run-level source of a long
# conversation must not grow a fact without bound.
MAX_SOURCE_MESSAGES = 16


def message_digest(message_id: str | None, role: str, text: str) -> str:
    """The digest a source keeps for a message: of its id, else of its role and text."""
    raw = f"id\0{message_id}" if message_id else f"{role}\0{text.strip()}"
    return hashlib.blake2b(
        raw.encode("utf-8", "replace"), digest_size=MESSAGE_DIGEST_BYTES
    ).hexdigest()


def _text_or_none(value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    return value.strip() if isinstance(value, str) and value.strip() else None


class Source(BaseModel):
    """One time a fact was learnt (immutable: sources are shared between document copies)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    thread_id: str | None = None
    messages: tuple[str, ...] = ()
    roles: tuple[Role, ...] = ()  # the role of each of ``messages``
    attribution: Attribution = "run"
    run_id: str | None = None
    at: datetime | None = None
    model: str | None = None
    prompt_version: str | None = None

    @field_validator("thread_id", "run_id", "model", "prompt_version", mode="before")
    @classmethod
    def _optional_text(cls, value: Any) -> str | None:
        return _text_or_none(value)

    @field_validator("messages", mode="before")
    @classmethod
    def _messages(cls, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list | tuple):
            return ()
        return tuple(v for v in value if isinstance(v, str) and v)[-MAX_SOURCE_MESSAGES:]

    @field_validator("roles", mode="before")
    @classmethod
    def _roles(cls, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list | tuple):
            return ()
        return tuple(v for v in value if v in ("user", "assistant"))[-MAX_SOURCE_MESSAGES:]

    @field_validator("attribution", mode="before")
    @classmethod
    def _attribution(cls, value: Any) -> str:
        return "message" if value == "message" else "run"

    @field_validator("at", mode="before")
    @classmethod
    def _at(cls, value: Any) -> datetime | None:
        return parse_timestamp(value)
