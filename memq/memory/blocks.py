"""Blocks of message text that are never memory: session uploads and recalled memory itself.

An agent framework puts two kinds of block into the messages it later hands over. Upload listings
(``<uploaded_files>``, and ``<current_uploads>`` from DeerFlow's uploads middleware) describe files
that are gone in the next thread. Recalled memory (memq's own ``<user_memory>`` block, DeerFlow's
``<memory>`` block) is what memory already holds: learning it again from an agent that echoes it
is a feedback loop that fills memory with copies of itself. Producer and worker strip the same
blocks with :func:`strip_blocks`, one linear scan over the tags: a lazy ``<a>[\\s\\S]*?</a>``
rescans to the end of the text for every opener without a closer, which is quadratic (a hundred
thousand characters of unclosed openers held the GIL for seconds).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# memq's injected block; the injector wraps memory in it.
INJECTED_MEMORY_TAG = "user_memory"
UPLOAD_TAGS = ("uploaded_files", "current_uploads")
RECALLED_MEMORY_TAGS = (INJECTED_MEMORY_TAG, "memory")
# What never reaches the memory model from a conversation.
NON_MEMORY_TAGS = (*UPLOAD_TAGS, *RECALLED_MEMORY_TAGS)


def tag_pattern(names: Iterable[str]) -> re.Pattern[str]:
    """Matches ``<name>`` and ``</name>`` of any of ``names``, case-insensitively: group 1 is the
    slash, group 2 the name. A fixed-length alternation, so ``finditer`` is linear in the text."""
    alternatives = "|".join(re.escape(name) for name in names)
    return re.compile(rf"<(/?)({alternatives})>", re.IGNORECASE)


NON_MEMORY_BLOCK = tag_pattern(NON_MEMORY_TAGS)
UPLOAD_BLOCK = tag_pattern(UPLOAD_TAGS)


def _after_newlines(text: str, index: int) -> int:
    while index < len(text) and text[index] == "\n":
        index += 1
    return index


def strip_blocks(
    text: str,
    tags: re.Pattern[str] = NON_MEMORY_BLOCK,
    *,
    unclosed: str = "cut",
    head_cut: bool = False,
) -> str:
    """``text`` without its ``tags`` blocks (and the newlines right after each), in one pass.

    A block runs from its opener to the closer of the same name; openers of that name inside it
    nest, tags of other names inside it are its content. An opener never closed: ``unclosed="cut"``
    drops the rest of the text (it is the block's content, cut short), ``"keep"`` leaves it as it
    is. With ``head_cut`` (the text is the tail of a longer one) a closer before any opener ends a
    block whose opener was cut away, so everything before it goes too; otherwise it is plain text.
    """
    if "<" not in text:
        return text
    pieces: list[str] = []
    position = 0  # start of the text not yet copied or dropped
    open_name: str | None = None
    open_at = depth = 0
    for match in tags.finditer(text):
        closing, name = bool(match.group(1)), match.group(2).lower()
        if open_name is None:
            if not closing:
                pieces.append(text[position : match.start()])
                open_name, open_at, depth = name, match.start(), 1
            elif head_cut and not pieces and position == 0:
                position = _after_newlines(text, match.end())
        elif name == open_name:
            depth += -1 if closing else 1
            if depth == 0:
                open_name = None
                position = _after_newlines(text, match.end())
    if open_name is None:
        pieces.append(text[position:])
    elif unclosed == "keep":
        pieces.append(text[open_at:])
    return "".join(pieces)
