"""Incremental extraction: which messages of a context are new since its last extraction.

A context's watermark is the identities of the last messages already extracted. Only what follows
it is sent, with a few earlier messages as context. When what is new does not fit the budget, the
oldest part that fits is extracted first and the watermark moves only past it: the rest is
extracted by the next run, never cut. Pure functions over :class:`memq.core.models.Message`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from memq.core.models import Message
from prompts.conversation import day_cost, message_text, render_line, truncate_middle
from prompts.tokens import TokenCounter

# Identities remembered per context: enough to find the boundary after the last extracted
# message was edited or summarised away, small enough to rewrite on every completion.
WATERMARK_DEPTH = 8


def _digest(raw: str) -> str:
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def message_identity(message: Message) -> str:
    """What marks a message across enqueues: a digest of its id, else a fingerprint of role and
    content — 19 characters either way, so the watermark (kept for days) never holds a user's
    ids or text, whatever their length.

    Never a list index: summarisation drops the front of the list and every index moves.
    """
    if message.id:
        return "id:" + _digest(message.id)
    return "fp:" + _digest(f"{message.role}\0{message.content.strip()}")


_DIGEST = re.compile(r"(?:id|fp):[0-9a-f]{16}")


def _remembered(entry: str) -> str:
    """A stored identity; a raw id (what watermarks held before the digests) read as its digest,
    so a thread extracted before the upgrade keeps its boundary."""
    return entry if _DIGEST.fullmatch(entry) else "id:" + _digest(entry)


def encode_watermark(identities: Sequence[str]) -> str | None:
    """The last ``WATERMARK_DEPTH`` identities, oldest first, as the JSON list stored in Redis."""
    if not identities:
        return None
    return json.dumps(list(identities[-WATERMARK_DEPTH:]), separators=(",", ":"))


def decode_watermark(raw: str | None) -> tuple[str, ...]:
    """The remembered identities; anything but a JSON list of strings remembers nothing (then
    everything is sent again: a few tokens, where a wrong boundary would lose messages)."""
    if not raw:
        return ()
    try:
        data = json.loads(raw)
    except ValueError:
        return ()
    if isinstance(data, list) and all(isinstance(item, str) for item in data):
        return tuple(_remembered(item) for item in data)
    return ()


def find_boundary(identities: Sequence[str], remembered: Sequence[str]) -> int:
    """Index of the last already-extracted message, or -1 when none is recognised.

    A candidate is a recognised message read as one remembered position; its run is how far the
    messages before it line up with the remembered ones before that position. A candidate is
    *consistent* when nothing before its run speaks against it: its run used up the remembered
    sequence (and no earlier message is one remembered as coming later), or every earlier message
    is unrecognised (the start of the thread, or a summary that replaced it). Consistent
    candidates beat the others, then the longest run wins, then the earliest. So a new "yes" that
    repeats an extracted "yes" is not taken for the boundary (its run is shorter or stops at a
    mismatch), and neither is a repeat of the old tail after summarisation kept only a message or
    two of it (the true boundary's run is short, but nothing contradicts it). When the last
    extracted message was edited away, the newest one still present marks it. Every doubt goes to
    the earlier candidate: re-sending extracted messages costs a few tokens (apply dedups what
    they yield), skipping a new one loses it.
    """
    if not remembered:
        return -1
    positions: dict[str, list[int]] = {}
    for index, identity in enumerate(remembered):
        positions.setdefault(identity, []).append(index)
    # latest_before[i]: the latest remembered position that the messages before i must come
    # after (each at its earliest possible place), -1 when none of them is recognised.
    latest_before = [-1]
    for identity in identities:
        earliest = positions[identity][0] if identity in positions else -1
        latest_before.append(max(latest_before[-1], earliest))
    best, best_score = -1, (False, 0)
    for index, identity in enumerate(identities):
        for at in positions.get(identity, ()):
            run = 0
            while run <= min(index, at) and identities[index - run] == remembered[at - run]:
                run += 1
            start = index - run + 1
            consistent = latest_before[start] == -1 or (
                run == at + 1 and latest_before[start] <= at
            )
            score = (consistent, run)
            if score > best_score:
                best, best_score = index, score
    return best


@dataclass(frozen=True, slots=True)
class Selection:
    """A context's messages split at its watermark."""

    context: tuple[Message, ...]  # already extracted, shown only so the new part reads well
    new: tuple[Message, ...]  # after the watermark: what the model learns from
    watermark: str | None  # to store once this run's result is saved (None: leave it)
    more: bool = False  # messages after ``new`` wait for another run (the budget was full)


@dataclass(frozen=True, slots=True)
class ChunkBudget:
    """How much new conversation one extraction may send, measured as the prompt renders it."""

    max_tokens: int
    message_max_chars: int
    count_tokens: TokenCounter

    def oldest_fitting(self, messages: Sequence[Message]) -> int:
        """How many of ``messages``, oldest first, fit ``max_tokens`` once each is cut to
        ``message_max_chars`` — at least one message with text, which the prompt then shrinks
        (blank messages cost nothing)."""
        used = 0
        before: Message | None = None  # the previous message with text
        for index, original in enumerate(messages):
            content = message_text(original)
            if not content:
                continue
            cut = truncate_middle(content, self.message_max_chars)
            cost = self.count_tokens(render_line(Message(original.role, cut, original.id))) + 1
            cost += day_cost(original, before, self.count_tokens)  # its day line, as rendered
            before = original
            if used + cost > self.max_tokens:
                return index if used else index + 1
            used += cost
        return len(messages)


def split_at_watermark(
    messages: Sequence[Message],
    watermark: str | None,
    context_messages: int,
    budget: ChunkBudget | None = None,
) -> Selection:
    """What follows ``watermark`` (everything when nothing is recognised), with up to
    ``context_messages`` earlier ones, and the watermark that covers what is selected.

    With a ``budget``, a new part that does not fit is cut to its oldest messages that do, the
    watermark covers only those and ``more`` is set, so the caller has the rest extracted next.
    A chunk whose watermark would equal the current one (a long run of messages repeating the
    remembered ones) is not cut: it could never move the watermark on, so the budget keeps the
    newest messages instead, as without chunks.
    """
    identities = [message_identity(m) for m in messages]
    boundary = find_boundary(identities, decode_watermark(watermark))
    end = len(messages)
    if budget is not None and boundary + 1 < end:
        taken = budget.oldest_fitting(messages[boundary + 1 :])
        if boundary + 1 + taken < end and encode_watermark(identities[: boundary + 1 + taken]) != (
            watermark or None
        ):
            end = boundary + 1 + taken
    new = tuple(messages[boundary + 1 : end])
    start = max(boundary + 1 - context_messages, 0)
    context = tuple(messages[start : boundary + 1]) if new else ()
    covered = encode_watermark(identities[:end]) or watermark
    return Selection(context, new, covered, more=end < len(messages))
