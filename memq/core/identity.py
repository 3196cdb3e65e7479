"""Validation of the three identifiers and the unambiguous context id built from them.

User ids and agent names become file names and Redis keys, so they are restricted to a safe
alphabet (no path separators, no dots-only names, no braces). Thread ids come from agent frameworks
and may hold anything printable; they are percent-encoded inside the context id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from memq.core.errors import InvalidIdentifier

DEFAULT_USER_ID = "default"
MAX_THREAD_ID_LENGTH = 512
MAX_USER_ID_LENGTH = 128
MAX_AGENT_NAME_LENGTH = 64

_USER_ID_RE = re.compile(r"[A-Za-z0-9_-]+")
_AGENT_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")


def validate_thread_id(thread_id: object) -> str:
    if not isinstance(thread_id, str) or not thread_id.strip():
        raise InvalidIdentifier(f"thread_id must be a non-blank string, got {thread_id!r:.80}")
    if len(thread_id) > MAX_THREAD_ID_LENGTH:
        raise InvalidIdentifier(f"thread_id is longer than {MAX_THREAD_ID_LENGTH} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in thread_id):
        raise InvalidIdentifier("thread_id must not contain control characters")
    return thread_id


def validate_user_id(user_id: object) -> str:
    """`None` is the unauthenticated user, stored as ``"default"`` (DeerFlow's convention)."""
    if user_id is None:
        return DEFAULT_USER_ID
    if not isinstance(user_id, str) or not user_id:
        raise InvalidIdentifier(f"user_id must be a non-empty string, got {user_id!r:.80}")
    if len(user_id) > MAX_USER_ID_LENGTH or not _USER_ID_RE.fullmatch(user_id):
        raise InvalidIdentifier(
            f"user_id {user_id!r:.80} must be 1-{MAX_USER_ID_LENGTH} characters of A-Z a-z 0-9 _ -"
        )
    return user_id


def validate_agent_name(agent_name: object) -> str | None:
    """`None` is the user-global memory. Names are case-insensitive and stored lower-cased,
    so ``MyAgent`` and ``myagent`` share one document (DeerFlow keyed its cache by the raw name
    but its file by the lower-cased one)."""
    if agent_name is None:
        return None
    if not isinstance(agent_name, str) or not agent_name:
        raise InvalidIdentifier(
            f"agent_name must be a non-empty string or None, got {agent_name!r:.80}"
        )
    if len(agent_name) > MAX_AGENT_NAME_LENGTH or not _AGENT_NAME_RE.fullmatch(agent_name):
        raise InvalidIdentifier(
            f"agent_name {agent_name!r:.80} must be 1-{MAX_AGENT_NAME_LENGTH} characters of "
            "A-Z a-z 0-9 _ -"
        )
    return agent_name.lower()


@dataclass(frozen=True, slots=True)
class ContextKey:
    """The identity of one conversation context: (thread, user, agent)."""

    thread_id: str
    user_id: str
    agent_name: str | None
    # ``<thread>:<user>:<agent>``, each part percent-encoded so ``:`` and braces never appear
    # inside a part; an empty agent part is the user-global memory. Computed once: the producer
    # needs it several times per call.
    id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        encoded = ":".join((quote(self.thread_id, safe=""), self.user_id, self.agent_name or ""))
        object.__setattr__(self, "id", encoded)

    @classmethod
    def create(cls, thread_id: object, user_id: object, agent_name: object) -> ContextKey:
        return cls(
            validate_thread_id(thread_id),
            validate_user_id(user_id),
            validate_agent_name(agent_name),
        )

    @classmethod
    def from_id(cls, context_id: str) -> ContextKey:
        parts = context_id.split(":")
        if len(parts) != 3:
            raise InvalidIdentifier(f"not a memq context id: {context_id!r:.120}")
        thread, user, agent = parts
        return cls.create(unquote(thread), user, agent or None)

    def describe(self) -> str:
        return f"thread={self.thread_id} user={self.user_id} agent={self.agent_name or '-'}"


def user_id_of(context_id: str) -> str:
    """The user part of a context id, without decoding the thread (the claim needs it for every
    candidate, ten times faster than :meth:`ContextKey.from_id`; user ids are never encoded)."""
    parts = context_id.split(":")
    if len(parts) != 3 or not _USER_ID_RE.fullmatch(parts[1]):
        raise InvalidIdentifier(f"not a memq context id: {context_id!r:.120}")
    return parts[1]
