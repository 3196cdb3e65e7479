"""Domain models shared by the producer, the queue and the worker.

Plain frozen dataclasses: they sit on the producer's hot path, where Pydantic validation of every
message would cost more than the Redis round trip.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from json.encoder import encode_basestring as _escape
from typing import Any, Literal

from memq.core.errors import InvalidMessages
from memq.core.identity import ContextKey
from memq.core.timestamps import stored_ms

Role = Literal["user", "assistant"]


@dataclass(frozen=True, slots=True)
class Message:
    """One filtered message: a user input or a final assistant answer, as plain text."""

    role: Role
    content: str
    id: str | None = None
    # When it was said, epoch milliseconds (``memq.core.timestamps``); None when the agent did
    # not say: the worker then takes the hand-off time.
    at: int | None = None

    def to_json(self) -> dict[str, str | int]:
        data: dict[str, str | int] = {"role": self.role, "content": self.content}
        if self.id is not None:
            data["id"] = self.id
        if self.at is not None:
            data["at"] = self.at
        return data

    @classmethod
    def from_json(cls, data: Any) -> Message:
        if not isinstance(data, Mapping):
            raise InvalidMessages(f"stored message is not an object: {data!r:.80}")
        role, content, mid = data.get("role"), data.get("content"), data.get("id")
        if role not in ("user", "assistant") or not isinstance(content, str):
            raise InvalidMessages(f"stored message has an unknown shape: {data!r:.80}")
        return cls(
            role=role,
            content=content,
            id=mid if isinstance(mid, str) else None,
            at=stored_ms(data.get("at")),
        )


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def messages_to_json(messages: tuple[Message, ...] | list[Message]) -> str:
    return sendable_json("[" + ",".join([message_json(m) for m in messages]) + "]")


def message_json(message: Message) -> str:
    """One message as compact JSON, byte for byte ``json.dumps(message.to_json(),
    ensure_ascii=False, separators=(",", ":"))`` (tests hold the two equal), before
    :func:`sendable_json`: the lists :func:`messages_to_json` returns are these joined by commas.

    Concatenated with the C string escaper: this runs for every message of every agent turn, and
    the general encoder's per-call setup cost as much as the escaping itself."""
    return encode_message(message.role, message.content, message.id, message.at)


def encode_message(role: str, content: str, message_id: str | None, at: int | None) -> str:
    """:func:`message_json` of the message with these fields, without building it (the
    producer's hot path carries filtered messages as tuples)."""
    # One f-string each (one allocation), not a chain of concatenations of the whole text.
    if message_id is None:
        if at is None:
            return f'{{"role":"{role}","content":{_escape(content)}}}'
        return f'{{"role":"{role}","content":{_escape(content)},"at":{int(at)}}}'
    if at is None:
        return f'{{"role":"{role}","content":{_escape(content)},"id":{_escape(message_id)}}}'
    return (
        f'{{"role":"{role}","content":{_escape(content)},"id":{_escape(message_id)},'
        f'"at":{int(at)}}}'
    )


def sendable_json(payload: str) -> str:
    """``payload`` as UTF-8 can carry it: a lone surrogate (half an emoji cut by a truncating
    agent) cannot be sent, so it is replaced (one character for one) rather than fail the turn."""
    if payload.isascii():
        return payload
    try:
        payload.encode("utf-8")
    except UnicodeEncodeError:
        payload = payload.encode("utf-8", "replace").decode("utf-8")
    return payload


def timed(messages: tuple[Message, ...], handed_at_ms: int | None) -> tuple[Message, ...]:
    """``messages``, each that carries no time stamped with the hand-off time."""
    if handed_at_ms is None or all(m.at is not None for m in messages):
        return messages
    return tuple(m if m.at is not None else replace(m, at=handed_at_ms) for m in messages)


def messages_from_json(raw: str) -> tuple[Message, ...]:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidMessages(f"stored messages are not JSON: {exc}") from exc
    if not isinstance(data, list):
        raise InvalidMessages("stored messages are not a list")
    return tuple(Message.from_json(item) for item in data)


@dataclass(frozen=True, slots=True)
class ConversationContext:
    """What the worker reads of one claimed (thread, user, agent): the messages pending and the
    trace id of the latest hand-off. The queue's bookkeeping (version, claim token, attempts)
    travels with the claim, not here."""

    key: ContextKey
    messages: tuple[Message, ...]
    trace_id: str | None = None
    # When the latest hand-off was captured (epoch ms), the time of each message that carried
    # none (already filled in by ``from_hash``).
    handed_at_ms: int | None = None

    @property
    def thread_id(self) -> str:
        return self.key.thread_id

    @property
    def user_id(self) -> str:
        return self.key.user_id

    @property
    def agent_name(self) -> str | None:
        return self.key.agent_name

    @classmethod
    def from_hash(cls, data: Mapping[str, str]) -> ConversationContext:
        """Decode the ``ctx:<id>`` hash (fields: docs/architecture.md, the Redis contract)."""
        try:
            key = ContextKey.create(
                data["thread_id"], data["user_id"], data.get("agent_name") or None
            )
            handed = stored_ms(_number(data.get("captured_ms")))
            return cls(
                key=key,
                messages=timed(messages_from_json(data.get("messages", "[]")), handed),
                trace_id=data.get("trace_id") or None,
                handed_at_ms=handed,
            )
        except (KeyError, ValueError) as exc:
            raise InvalidMessages(f"context hash is malformed: {exc}") from exc
