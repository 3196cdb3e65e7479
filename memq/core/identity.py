"""Validation of the three identifiers, their encoding into key and file names, and the
unambiguous context id built from them.

Applications key users by whatever they have: an e-mail address, ``auth0|…``, a dotted id. Any
printable id up to a length is accepted; control characters, blank ids and lone surrogates are
refused (they cannot be stored as UTF-8, or hide from the operator who reads them).

Ids reach Redis keys and file names through :func:`encode_segment`: every character outside
``A-Z a-z 0-9 _ -`` becomes the percent-encoding of its UTF-8 bytes (upper-case hex). The
encoding is reversible and collision-free, never holds a path separator, a dot, ``:`` or a brace,
and is the identity on that safe alphabet: the only one ids could use before, so existing keys
and folders keep their names. Encoded names differ only in letter case when the ids themselves
do, so a case-insensitive file system merges nothing the encoding added (ids that differ only in
case, like ``Alice`` and ``alice``, share a folder there, as they did before; use Redis storage or
a case-sensitive file system for such ids).

The anonymous user (``None``) is :data:`ANONYMOUS_USER_ID` inside memq and keeps the place the
literal id ``"default"`` used to share with it (``default`` in keys and folders), so its memory is
still found; the literal ``"default"`` is a user of its own, stored as ``%64efault``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from memq.core.errors import InvalidIdentifier

# Stands for the anonymous user wherever memq passes a user id around. It holds a control
# character, which no id from outside may, so no real user can ever be it.
ANONYMOUS_USER_ID = "\x00anonymous"
# The anonymous user's id before it was told apart from a user literally named ``default``; it
# keeps that name in keys and folders.
DEFAULT_USER_ID = ANONYMOUS_USER_ID
_ANONYMOUS_SEGMENT = "default"
_LITERAL_DEFAULT_SEGMENT = "%64efault"  # "d" escaped: the plain name is the anonymous user's
MAX_THREAD_ID_LENGTH = 512
MAX_USER_ID_LENGTH = 255
MAX_AGENT_NAME_LENGTH = 128
# The longest name most file systems take for one path component; an id whose encoding is longer
# could be queued but never saved to a file.
MAX_ENCODED_LENGTH = 255

_SAFE_RE = re.compile(r"[A-Za-z0-9_-]*")
_UNSAFE_RE = re.compile(r"[^A-Za-z0-9_-]")
_SEGMENT_RE = re.compile(r"(?:[A-Za-z0-9_-]|%[0-9A-F]{2})*")


def encode_segment(text: str) -> str:
    """``text`` with every character outside ``A-Z a-z 0-9 _ -`` percent-encoded (UTF-8 bytes)."""
    if _SAFE_RE.fullmatch(text):
        return text
    return _UNSAFE_RE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8")), text)


def decode_segment(segment: str) -> str:
    """The text :func:`encode_segment` made ``segment`` from; InvalidIdentifier for anything it
    cannot have made (so decoding is a bijection, and a stray folder never aliases a user)."""
    if "%" not in segment and _SAFE_RE.fullmatch(segment):
        return segment
    if not _SEGMENT_RE.fullmatch(segment):
        raise InvalidIdentifier(f"not an encoded memq id: {segment!r:.80}")
    try:
        text = unquote(segment, errors="strict")
    except UnicodeDecodeError:
        raise InvalidIdentifier(f"not an encoded memq id: {segment!r:.80}") from None
    if encode_segment(text) != segment:
        raise InvalidIdentifier(f"not the canonical encoding of an id: {segment!r:.80}")
    return text


def encode_user(user_id: str) -> str:
    """The key and file name part of a (validated) user id."""
    if user_id == ANONYMOUS_USER_ID:
        return _ANONYMOUS_SEGMENT
    if user_id == _ANONYMOUS_SEGMENT:
        return _LITERAL_DEFAULT_SEGMENT
    return encode_segment(user_id)


def decode_user(segment: str) -> str:
    if segment == _ANONYMOUS_SEGMENT:
        return ANONYMOUS_USER_ID
    if segment == _LITERAL_DEFAULT_SEGMENT:
        return _ANONYMOUS_SEGMENT
    return decode_segment(segment)


def encode_agent(agent_name: str | None) -> str:
    """The key and file name part of a (validated) agent name; empty for the user-global memory."""
    return "" if agent_name is None else encode_segment(agent_name)


def decode_agent(segment: str) -> str | None:
    return None if segment == "" else decode_segment(segment)


def describe_user(user_id: str) -> str:
    """How a user id is shown to an operator."""
    return "(anonymous)" if user_id == ANONYMOUS_USER_ID else user_id


def _check_text(kind: str, value: object, max_length: int) -> str:
    if not isinstance(value, str) or not value.strip():
        # The type, never the value: the caller's text does not travel on in an error.
        got = "a blank string" if isinstance(value, str) else type(value).__name__
        raise InvalidIdentifier(f"{kind} must be a non-blank string, got {got}")
    if len(value) > max_length:
        raise InvalidIdentifier(f"{kind} is longer than {max_length} characters")
    if not value.isprintable():
        # Refuses every category C character (controls, format characters, lone surrogates,
        # unassigned) and every separator but the plain space.
        if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
            raise InvalidIdentifier(f"{kind} holds a lone surrogate (not encodable as UTF-8)")
        raise InvalidIdentifier(
            f"{kind} must not contain control, format or separator characters (but spaces)"
        )
    return value


def validate_thread_id(thread_id: object) -> str:
    return _check_text("thread_id", thread_id, MAX_THREAD_ID_LENGTH)


def validate_user_id(user_id: object) -> str:
    """`None` is the anonymous user, :data:`ANONYMOUS_USER_ID` (also accepted back)."""
    if user_id is None or user_id == ANONYMOUS_USER_ID:
        return ANONYMOUS_USER_ID
    user = _check_text("user_id", user_id, MAX_USER_ID_LENGTH)
    if len(encode_user(user)) > MAX_ENCODED_LENGTH:
        raise InvalidIdentifier(
            f"user_id is longer than {MAX_ENCODED_LENGTH} characters once encoded for file names"
        )
    return user


def validate_named_user(user_id: object, *, ask: str) -> str:
    """A user id a door's caller named: never None (no silent anonymous default) and never the
    anonymous user's internal id (``%00anonymous`` in a path): the anonymous user is reached only
    by asking for it the way ``ask`` says."""
    if user_id is None or user_id == "":
        raise InvalidIdentifier(f"no user named: {ask}")
    if user_id == ANONYMOUS_USER_ID:
        raise InvalidIdentifier(f"user_id: the anonymous user is not addressed by id; {ask}")
    return validate_user_id(user_id)


def validate_agent_name(agent_name: object) -> str | None:
    """`None` is the user-global memory. Names are case-insensitive and stored lower-cased,
    so ``MyAgent`` and ``myagent`` share one document (DeerFlow keyed its cache by the raw name
    but its file by the lower-cased one)."""
    if agent_name is None:
        return None
    name = _check_text("agent_name", agent_name, MAX_AGENT_NAME_LENGTH).lower()
    if len(encode_segment(name)) > MAX_ENCODED_LENGTH:
        raise InvalidIdentifier(
            f"agent_name is longer than {MAX_ENCODED_LENGTH} characters once encoded"
        )
    return name


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
        encoded = ":".join(
            (
                quote(self.thread_id, safe=""),
                encode_user(self.user_id),
                encode_agent(self.agent_name),
            )
        )
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
        try:
            thread_id = unquote(thread, errors="strict")
        except UnicodeDecodeError:
            raise InvalidIdentifier(f"not a memq context id: {context_id!r:.120}") from None
        return cls.create(thread_id, decode_user(user), decode_agent(agent))

    def describe(self) -> str:
        return (
            f"thread={self.thread_id} user={describe_user(self.user_id)} "
            f"agent={self.agent_name or '-'}"
        )


def user_id_of(context_id: str) -> str:
    """The user of a context id, without decoding the thread (the claim needs it for every
    candidate, ten times faster than :meth:`ContextKey.from_id`)."""
    parts = context_id.split(":")
    if len(parts) != 3 or not parts[1]:
        raise InvalidIdentifier(f"not a memq context id: {context_id!r:.120}")
    return decode_user(parts[1])
