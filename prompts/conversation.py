"""The conversation slot of the update prompt: how each message renders, and which fit.

Pure functions over :class:`memq.core.models.Message` and a ``count_tokens`` callable. The newest
messages are kept within a token budget (the end of a thread is what the model must see); a long
message keeps its head and its tail, because the conclusion of an answer is usually at its end.
Which messages are new since the last extraction is the worker's business (``worker.watermark``).

Each message's day is shown once, on a ``Date:`` line before the first message of that day (not
per message: a session of fifty turns pays for its date once), so the model can resolve "last
Saturday" to a date. A message line always starts with its role or its label, and continuation
lines are indented: a ``Date:`` line at the start of a line can only be ours.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

# `regex`, not `re`: it knows Unicode properties (control and format characters).
import regex

from memq.core.models import Message
from memq.core.timestamps import day_of, ms_datetime
from memq.memory.blocks import strip_blocks
from prompts.escaping import LINE_BREAK, indented
from prompts.tokens import TokenCounter
from storage.sources import MAX_EXCERPT_CHARS

log = logging.getLogger(__name__)

_ROLE_LABEL = {"user": "User", "assistant": "Assistant"}
_MIN_KEEP_CHARS = 40
# What an excerpt drops: control and format characters (line breaks are folded first), and lone
# surrogates, which no UTF-8 document can hold.
_UNSHOWN = regex.compile(r"[[\p{Cc}\p{Cf}\ud800-\udfff]--[\u200c\u200d]]+", regex.V1)
_SPACES = regex.compile(r"\s{2,}")


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


def message_excerpt(message: Message) -> str:
    """The start of ``message``'s text as a fact's source keeps it: one line (line breaks and
    runs of space folded), control, format (less the joiners emoji need) and surrogate characters
    dropped, at most ``MAX_EXCERPT_CHARS`` characters (``…`` ending one that was cut)."""
    text = _UNSHOWN.sub("", LINE_BREAK.sub(" ", message_text(message)).replace("\t", " "))
    text = _SPACES.sub(" ", text).strip()
    if len(text) <= MAX_EXCERPT_CHARS:
        return text
    return text[: MAX_EXCERPT_CHARS - 1].rstrip() + "…"


def render_line(message: Message, label: str | None = None) -> str:
    """``User: …`` / ``Assistant: …`` (``[m1] User: …`` with a citation label); continuation
    lines are indented, so a line that starts with a role or a label can only be ours — a
    message cannot forge another turn, nor a label to be cited by."""
    line = f"{_ROLE_LABEL[message.role]}: {indented(message.content)}"
    return line if label is None else f"[{label}] {line}"


def day_line(at_ms: int) -> str:
    """``Date: 2023-05-08 (Monday)``: the day (UTC) of the messages below it."""
    moment = ms_datetime(at_ms)
    return f"Date: {day_of(moment)} ({moment:%A})"


def _day(message: Message) -> str | None:
    return None if message.at is None else day_of(ms_datetime(message.at))


def day_cost(message: Message, before: Message | None, count_tokens: TokenCounter) -> int:
    """The tokens :func:`render_conversation` spends on ``message``'s day line, after ``before``
    (None: it is the first): its day line and line break when its day starts there, else 0. The
    one rule the prompt's budget and the worker's chunk budget both count by."""
    if message.at is None or not starts_day(message, before):
        return 0
    return count_tokens(day_line(message.at)) + 1


def render_conversation(
    messages: Sequence[Message], labels: Sequence[str | None] | None = None
) -> str:
    """The messages one blank line apart, a :func:`day_line` before each dated message whose day
    differs from the message before it (the first one's always): a day's messages show it once."""
    parts: list[str] = []
    for index, message in enumerate(messages):
        line = render_line(message, None if labels is None else labels[index])
        if message.at is not None and starts_day(message, messages[index - 1] if index else None):
            line = f"{day_line(message.at)}\n{line}"
        parts.append(line)
    return "\n\n".join(parts)


def starts_day(message: Message, before: Message | None) -> bool:
    """Whether ``message`` shows its day: it has one, and ``before`` (None: it is the first)
    is of another day or has none."""
    return message.at is not None and (before is None or _day(before) != _day(message))


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
        return render_conversation(self.messages)

    def labelled_text(self, labels: tuple[str, ...]) -> str:
        if len(labels) != len(self.messages):
            raise ValueError("one label per message")
        return render_conversation(self.messages, labels)


def _shrink_to_fit(message: Message, budget: int, count_tokens: TokenCounter) -> Message:
    """The newest message alone is over budget: cut its middle until it fits."""
    low, high = _MIN_KEEP_CHARS, len(message.content)
    best = truncate_middle(message.content, low)
    while low <= high:
        mid = (low + high) // 2
        candidate = truncate_middle(message.content, mid)
        if count_tokens(render_line(replace(message, content=candidate))) <= budget:
            best, low = candidate, mid + 1
        else:
            high = mid - 1
    return replace(message, content=best)


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
    truncated = 0
    usable = [m for m in messages if message_text(m)]
    used = oldest_day = 0  # oldest_day: the day line the oldest message kept so far pays for
    for index in range(len(usable) - 1, -1, -1):
        original = usable[index]
        content = message_text(original)
        cut = truncate_middle(content, message_max_chars)
        # Most messages come through untouched: no copy for them.
        message = original if cut == original.content else replace(original, content=cut)
        cost = count_tokens(render_line(message)) + 1  # +1: the blank line between messages
        # Exactly as rendered: the oldest message kept shows its day; the one before it (kept
        # so far as the oldest) no longer does when it is of the same day.
        own_day = day_cost(original, None, count_tokens)
        if kept and day_cost(kept[-1], original, count_tokens) == 0:
            cost -= oldest_day
        cost += own_day
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
        oldest_day = own_day
    return ConversationSlice(tuple(reversed(kept)), 0, truncated)
