"""The conversation slot of the update prompt: which messages go in, and how each is cut.

Pure functions over :class:`core.models.Message` and a ``count_tokens`` callable. The newest
messages are kept within a token budget (the end of a thread is what the model must see); a long
message keeps its head and its tail, because the conclusion of an answer is usually at its end
(§10.8).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.models import Message
from prompts.escaping import neutralise_tags

log = logging.getLogger(__name__)

TokenCounter = Callable[[str], int]

# Defence in depth: the producer strips upload blocks, but a caller may bypass it.
_UPLOAD_BLOCK = re.compile(r"<(uploaded_files|current_uploads)>[\s\S]*?</\1>\n*", re.IGNORECASE)
_ROLE_LABEL = {"user": "User", "assistant": "Assistant"}
_MIN_KEEP_CHARS = 40


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail of ``text`` in about ``max_chars``, saying what was cut."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars - 32, _MIN_KEEP_CHARS)
    head, tail = text[: (keep + 1) // 2], text[len(text) - keep // 2 :]
    return f"{head} […{len(text) - len(head) - len(tail)} characters cut…] {tail}"


def select_messages(
    messages: Sequence[Message], watermark: str | None, context_messages: int
) -> tuple[tuple[Message, ...], str | None]:
    """Which messages of a context to send, and the watermark to remember after a success.

    The seam for incremental extraction: a later version sends only what follows ``watermark`` plus
    ``context_messages`` earlier ones. For now every message is sent and the watermark is the id of
    the last message (``None`` when it has no id).
    """
    selected = tuple(messages)
    return selected, (selected[-1].id if selected else watermark)


def _clean(message: Message) -> str:
    text = message.content
    if message.role == "user" and "<" in text:
        text = _UPLOAD_BLOCK.sub("", text)
    return text.strip()


def render_line(message: Message) -> str:
    return f"{_ROLE_LABEL[message.role]}: {neutralise_tags(message.content)}"


@dataclass(frozen=True, slots=True)
class ConversationSlice:
    """The messages that fit (content already cut), oldest first, and what was left out."""

    messages: tuple[Message, ...]
    dropped: int
    truncated: int

    @property
    def text(self) -> str:
        return "\n\n".join(render_line(m) for m in self.messages)


def _shrink_to_fit(message: Message, budget: int, count_tokens: TokenCounter) -> Message:
    """The newest message alone is over budget: cut its middle until it fits."""
    low, high = _MIN_KEEP_CHARS, len(message.content)
    best = truncate_middle(message.content, low)
    while low <= high:
        mid = (low + high) // 2
        candidate = truncate_middle(message.content, mid)
        if count_tokens(render_line(Message(message.role, candidate, message.id))) <= budget:
            best, low = candidate, mid + 1
        else:
            high = mid - 1
    return Message(message.role, best, message.id)


def budget_conversation(
    messages: Sequence[Message],
    *,
    max_tokens: int,
    message_max_chars: int,
    count_tokens: TokenCounter,
) -> ConversationSlice:
    """Newest first, keep what fits ``max_tokens``; never the whole of an oversized message."""
    kept: list[Message] = []
    used = 0
    truncated = 0
    usable = [m for m in messages if _clean(m)]
    for index in range(len(usable) - 1, -1, -1):
        original = usable[index]
        content = _clean(original)
        cut = truncate_middle(content, message_max_chars)
        message = Message(original.role, cut, original.id)
        cost = count_tokens(render_line(message)) + 1  # +1: the blank line between messages
        if used + cost > max_tokens:
            if not kept:
                kept.append(_shrink_to_fit(message, max_tokens, count_tokens))
                truncated += 1
            dropped = len(usable) - len(kept)
            log.info(
                "conversation over its budget of %d tokens: sending the newest %d of %d messages",
                max_tokens,
                len(kept),
                len(usable),
            )
            return ConversationSlice(tuple(reversed(kept)), dropped, truncated)
        if cut != content:
            truncated += 1
        kept.append(message)
        used += cost
    return ConversationSlice(tuple(reversed(kept)), 0, truncated)
