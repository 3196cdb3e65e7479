"""The conversation slot of the update prompt: how each message renders, and which fit.

Pure functions over :class:`memq.core.models.Message` and a ``count_tokens`` callable. The newest
messages are kept within a token budget (the end of a thread is what the model must see); a long
message keeps its head and its tail, because the conclusion of an answer is usually at its end.
Which messages are new since the last extraction is the worker's business (``worker.watermark``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from memq.core.models import Message
from memq.memory.blocks import strip_blocks
from prompts.escaping import indented
from prompts.tokens import TokenCounter

log = logging.getLogger(__name__)

_ROLE_LABEL = {"user": "User", "assistant": "Assistant"}
_MIN_KEEP_CHARS = 40


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail of ``text`` in about ``max_chars``, saying what was cut."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars - 32, _MIN_KEEP_CHARS)
    head, tail = text[: (keep + 1) // 2], text[len(text) - keep // 2 :]
    return f"{head} […{len(text) - len(head) - len(tail)} characters cut…] {tail}"


def message_text(message: Message) -> str:
    """The text of ``message`` as the prompt sends it (upload and recalled-memory blocks removed,
    stripped). Defence in depth: the producer strips the same blocks, but a caller may bypass it."""
    return strip_blocks(message.content).strip()


def render_line(message: Message, label: str | None = None) -> str:
    """``User: …`` / ``Assistant: …`` (``[m1] User: …`` with a citation label); continuation
    lines are indented, so a line that starts with a role or a label can only be ours — a
    message cannot forge another turn, nor a label to be cited by."""
    line = f"{_ROLE_LABEL[message.role]}: {indented(message.content)}"
    return line if label is None else f"[{label}] {line}"


def citation_labels(count: int) -> tuple[str, ...]:
    """The labels of ``count`` new messages, oldest first: short, and the same for the same
    position in every prompt, so an answer can cite them."""
    return tuple(f"m{i}" for i in range(1, count + 1))


@dataclass(frozen=True, slots=True)
class ConversationSlice:
    """The messages that fit (content already cut), oldest first, and what was left out."""

    messages: tuple[Message, ...]
    dropped: int
    truncated: int

    @property
    def text(self) -> str:
        return "\n\n".join(render_line(m) for m in self.messages)

    def labelled_text(self, labels: tuple[str, ...]) -> str:
        return "\n\n".join(
            render_line(m, label) for m, label in zip(self.messages, labels, strict=True)
        )


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
    shrink: bool = True,
) -> ConversationSlice:
    """Newest first, keep what fits ``max_tokens``; never the whole of an oversized message.

    With ``shrink`` the newest message is cut to fit when it alone is over budget (it is what the
    model must see); without it (context that is nice to have) nothing is sent then.
    """
    kept: list[Message] = []
    used = 0
    truncated = 0
    usable = [m for m in messages if message_text(m)]
    for index in range(len(usable) - 1, -1, -1):
        original = usable[index]
        content = message_text(original)
        cut = truncate_middle(content, message_max_chars)
        message = Message(original.role, cut, original.id)
        cost = count_tokens(render_line(message)) + 1  # +1: the blank line between messages
        if used + cost > max_tokens:
            if not kept and shrink:
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
