"""Correction and reinforcement signals in the messages an extraction is about to send.

A correction ("that's wrong", "不对") tells the memory LLM to record what the user rejected;
a reinforcement ("perfect", "就是这样") tells it which behaviour to keep. Both are cheap regex
searches over each user message of the new part of a conversation only: a message already
extracted must not flag every later run. The patterns are DeerFlow's, as data, with the
deviations below from DeerFlow's detectors, each covered by tests/test_signals.py:

* the English patterns accept the curly apostrophe (’) as well as the ASCII one, because phones and
  word processors type "that’s wrong";
* C3 "try again" no longer fires when the user speaks of trying again themselves ("let me try again
  later", "I'll try again") — an imperative "try again" still does;
* C5 "不对" no longer fires inside 不对称 ("asymmetric") or 不对等 ("unequal");
* R5 "keep (doing) that" no longer fires on "keep that in mind", which asks to remember a fact
  rather than praising a behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memq.core.models import Message

_APOS = "['’]"
# "Terminal": the phrase ends the sentence or the text (`$` without MULTILINE, as in DeerFlow).
_END_EN = r"(?:[.!?]|$)"
_END_ZH = r"(?:[。！？!?.]|$)"

CORRECTION_PATTERNS_EN: tuple[str, ...] = (
    rf"\bthat(?:{_APOS}s| is) (?:wrong|incorrect)\b",
    r"\byou misunderstood\b",
    # Not when the user is the one who will try again: "let me / I'll / we'll try again (later)".
    rf"(?<!let me )(?<!i{_APOS}ll )(?<!i will )(?<!we{_APOS}ll )\btry again\b(?!\s+later\b)",
    r"\bredo\b",
)
CORRECTION_PATTERNS_ZH: tuple[str, ...] = (
    "不对(?![称等])",  # 不对称 "asymmetric", 不对等 "unequal" are not corrections
    "你理解错了",
    "你理解有误",
    "重试",
    "重新来",
    "换一种",
    "改用",
)
REINFORCEMENT_PATTERNS_EN: tuple[str, ...] = (
    rf"\byes[,.]?\s+(?:exactly|perfect|that(?:{_APOS}s| is) (?:right|correct|it))\b",
    rf"\bperfect{_END_EN}",
    r"\bexactly\s+(?:right|correct)\b",
    rf"\bthat(?:{_APOS}s| is)\s+(?:exactly\s+)?(?:right|correct|what i (?:wanted|needed|meant))\b",
    r"\bkeep\s+(?:doing\s+)?that\b(?!\s+in\s+mind\b)",  # "keep that in mind" is not praise
    r"\bjust\s+(?:like\s+)?(?:that|this)\b",
    rf"\bthis is (?:great|helpful)\b{_END_EN}",
    rf"\bthis is what i wanted\b{_END_EN}",
)
REINFORCEMENT_PATTERNS_ZH: tuple[str, ...] = (
    rf"对[，,]?\s*就是这样{_END_ZH}",
    rf"完全正确{_END_ZH}",
    rf"(?:对[，,]?\s*)?就是这个意思{_END_ZH}",
    rf"正是我想要的{_END_ZH}",
    rf"继续保持{_END_ZH}",
)


# Literal words every pattern of a class needs (lower-cased English, Chinese as is). A message
# without any of them cannot match, and `in` is far cheaper than a search through all the
# alternatives at every position.
CORRECTION_TRIGGERS: tuple[str, ...] = (
    "wrong", "incorrect", "misunderstood", "try again", "redo",
    "不对", "你理解", "重试", "重新来", "换一种", "改用",
)  # fmt: skip
REINFORCEMENT_TRIGGERS: tuple[str, ...] = (
    "yes", "perfect", "exactly", "right", "correct", "what i", "keep", "just", "this is",
    "就是这", "完全正确", "正是我想要的", "继续保持",
)  # fmt: skip


class _Detector:
    def __init__(
        self, english: Sequence[str], chinese: Sequence[str], triggers: Sequence[str]
    ) -> None:
        # One alternation per flag set: only "does any pattern match" matters, so the order of
        # the alternatives does not.
        self._patterns = (
            re.compile("|".join(f"(?:{p})" for p in english), re.IGNORECASE),
            re.compile("|".join(f"(?:{p})" for p in chinese)),
        )
        self._triggers = tuple(triggers)

    def __call__(self, text: str) -> bool:
        text = text.strip()
        lowered = text.lower()
        if not text or not any(t in lowered for t in self._triggers):
            return False
        return any(p.search(text) for p in self._patterns)


_CORRECTION = _Detector(CORRECTION_PATTERNS_EN, CORRECTION_PATTERNS_ZH, CORRECTION_TRIGGERS)
_REINFORCEMENT = _Detector(
    REINFORCEMENT_PATTERNS_EN, REINFORCEMENT_PATTERNS_ZH, REINFORCEMENT_TRIGGERS
)


def is_correction(text: str) -> bool:
    """Does this user message say the agent got something wrong?"""
    return _CORRECTION(text)


def is_reinforcement(text: str) -> bool:
    """Does this user message approve of what the agent did?"""
    return _REINFORCEMENT(text)


def signals_in(messages: Sequence[Message]) -> tuple[bool, bool]:
    """``(correction, reinforcement)`` in any user message of ``messages``; a correction
    suppresses a reinforcement (the hint would contradict it)."""
    user = [m.content for m in messages if m.role == "user"]
    correction = any(is_correction(text) for text in user)
    return correction, (not correction) and any(is_reinforcement(text) for text in user)
