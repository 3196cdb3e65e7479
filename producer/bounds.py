"""How much one hand-off may carry: the producer's size cap, counted as it is sent.

The cap is on what reaches Redis, so it counts the JSON the script receives — ids, keys, quotes
and escapes included — not only the message text (a 10 MB message id once passed a content-only
cap). Three bounds, each applied newest first, because the end of a conversation is what the
worker has not seen yet:

- a message id longer than :data:`MAX_MESSAGE_ID_CHARS` is replaced by a fixed-length digest of
  itself (the same id always gives the same digest, so a re-sent message is still recognised);
- a message longer than half the cap is cut to its tail of half the cap, whatever its position,
  so a long question followed by its answer keeps the end of the question (the same message is
  always cut the same way, so later hand-offs still recognise it);
- the newest messages whose encoded size fits ``max_chars``, at most ``max_messages`` of them;
  when even the newest does not fit once cut (text that escapes heavily), its tail is kept.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from memq.core.models import Message, encode_message, message_json, sendable_json
from producer.messages import Row

log = logging.getLogger(__name__)

# Ids are what the merge and the watermark match messages by; real ones (UUIDs, LangChain run
# ids, provider ids) are well under this.
MAX_MESSAGE_ID_CHARS = 128
_ID_DIGEST_PREFIX = "sha:"


def bounded_id(message_id: str | None) -> str | None:
    """``message_id`` as it is when short enough, else ``sha:`` and 32 hex digits of its blake2b
    digest: fixed length, and the same for every hand-off of that message."""
    if message_id is None or len(message_id) <= MAX_MESSAGE_ID_CHARS:
        return message_id
    digest = hashlib.blake2b(message_id.encode("utf-8", "surrogatepass"), digest_size=16)
    return _ID_DIGEST_PREFIX + digest.hexdigest()


@dataclass(frozen=True, slots=True)
class HandOff:
    """The encoded hand-off and what the caps left out (for the log line and the tests)."""

    messages_json: str
    kept: int
    dropped: int  # older messages left out whole
    shortened: int  # messages of which only the tail was kept


# An agent hands the whole thread over on every turn: all but the newest messages were encoded
# on an earlier turn. The encodings of recent messages are kept, bounded in entries and in the
# length of a message kept (a few MB at most; the agent's process holds these messages anyway),
# so a re-sent message costs a dictionary hit instead of escaping it again.
_KEPT_MESSAGES = 1024
_KEPT_CONTENT_CHARS = 2000
_encoded_again = functools.lru_cache(maxsize=_KEPT_MESSAGES)(encode_message)


def hand_off_json(rows: Sequence[Row], max_chars: int, max_messages: int) -> str:
    """:func:`bound_hand_off`'s JSON of the messages in ``rows``. The common turn is within every
    cap as it is: then each row is encoded once, oldest first, with no message built and nothing
    reversed. Otherwise (or as soon as the encoded size passes ``max_chars``, so the work stays
    bounded by the cap) the general pass decides."""
    if len(rows) <= max_messages:
        half = max(1, max_chars // 2)
        parts: list[str] = []
        used = 0
        for role, content, message_id, at in rows:
            if len(content) > half or (
                message_id is not None and len(message_id) > MAX_MESSAGE_ID_CHARS
            ):
                break
            part = (
                _encoded_again(role, content, message_id, at)
                if len(content) <= _KEPT_CONTENT_CHARS
                else encode_message(role, content, message_id, at)
            )
            used += len(part) + 1  # its comma (or a bracket)
            if used > max_chars:
                break
            parts.append(part)
        else:
            return sendable_json("[" + ",".join(parts) + "]")
    return bound_hand_off([Message(*row) for row in rows], max_chars, max_messages).messages_json


def bound_hand_off(messages: Sequence[Message], max_chars: int, max_messages: int) -> HandOff:
    """The newest of ``messages`` within the caps (the module docstring), encoded once: one pass
    from the newest, each message encoded as it is taken and counted at its encoded size."""
    half = max(1, max_chars // 2)
    parts: list[str] = []
    used = shortened = 0
    start = len(messages)
    for index in range(len(messages) - 1, max(-1, len(messages) - 1 - max_messages), -1):
        message = messages[index]
        content, message_id = message.content, message.id
        cut = len(content) > half
        if cut or (message_id is not None and len(message_id) > MAX_MESSAGE_ID_CHARS):
            content, message_id = content[-half:], bounded_id(message_id)
            message = Message(message.role, content, message_id, message.at)
        part = message_json(message)
        cost = len(part) + 1  # its comma (or a bracket)
        if used + cost > max_chars:
            if parts:
                break
            # Even the newest does not fit once cut: it escapes to more than its length.
            part, cut = _shrunk_to(message, max_chars - 2), True
            cost = len(part) + 1
        shortened += cut
        parts.append(part)
        used += cost
        start = index
    parts.reverse()
    dropped = start
    if dropped or shortened:
        _log_cut(len(messages), max_chars, max_messages, len(parts), shortened)
    return HandOff(sendable_json("[" + ",".join(parts) + "]"), len(parts), dropped, shortened)


def _log_cut(total: int, max_chars: int, max_messages: int, kept: int, shortened: int) -> None:
    log.info(
        "memq: hand-off of %d messages over %d chars or %d messages; kept the newest %d "
        "(%d cut to their tail)",
        total,
        max_chars,
        max_messages,
        kept,
        shortened,
    )


def _shrunk_to(message: Message, limit: int) -> str:
    """The encoded message with the longest tail of its content that encodes within ``limit``."""
    low, high = 0, len(message.content)
    best = message_json(Message(message.role, "", message.id, message.at))
    while low <= high:  # a binary search on the tail length: log(n) encodings
        mid = (low + high) // 2
        tail = message.content[len(message.content) - mid :]
        candidate = message_json(Message(message.role, tail, message.id, message.at))
        if len(candidate) <= limit:
            best, low = candidate, mid + 1
        else:
            high = mid - 1
    return best
