"""Correction / reinforcement detection (reference §2), including every verified example of §2.2
and memq's documented deviations from DeerFlow."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.core.models import Message
from memq.memory.signals import (
    CORRECTION_PATTERNS_EN,
    CORRECTION_PATTERNS_ZH,
    REINFORCEMENT_PATTERNS_EN,
    REINFORCEMENT_PATTERNS_ZH,
    is_correction,
    is_reinforcement,
    signals_in,
)


def turn(*user_texts: str) -> list[Message]:
    messages: list[Message] = []
    for text in user_texts:
        messages += [Message("user", text), Message("assistant", "ok")]
    return messages


# (text, correction, reinforcement) as DeerFlow's §2.2 examples verify them.
SECTION_2_2 = [
    ("That's wrong", True, False),
    ("我们改用 uv 吧", True, False),
    ("Perfect", False, True),
    ("perfect!", False, True),
    ("perfect solution", False, False),
    ("This is great", False, True),
    ("This is great, thanks", False, False),
    ("just this", False, True),
    ("just do this", False, False),
    ("对，就是这样", False, True),
    ("对就是这样吧", False, False),
    ("继续保持这个风格", False, False),
    ("That's right, but …", False, True),
]

# Where memq deliberately differs from DeerFlow (reference §10 item 17); DeerFlow's answer in the
# comment.
DEVIATIONS = [
    ("That’s wrong", True, False),  # DeerFlow: no (curly apostrophe not recognised)
    ("不对称的设计", False, False),  # DeerFlow: correction (false positive)
    ("Let me try again later", False, False),  # DeerFlow: correction (false positive)
    ("I'll try again tomorrow", False, False),
    ("keep that in mind", False, False),  # DeerFlow: reinforcement (false positive)
    ("That’s exactly what I wanted", False, True),
    ("Yes, that’s it", False, True),
]


@pytest.mark.parametrize(("text", "correction", "reinforcement"), SECTION_2_2 + DEVIATIONS)
def test_verified_examples(text: str, correction: bool, reinforcement: bool) -> None:
    assert is_correction(text) is correction
    assert is_reinforcement(text) is reinforcement
    assert signals_in(turn(text)) == (correction, reinforcement and not correction)


@pytest.mark.parametrize(
    "text",
    [
        "that is incorrect",
        "THAT IS WRONG.",
        "you misunderstood me",
        "try again",
        "Please try again with the other file",
        "redo it",
        "这个不对",
        "不对，应该是周二",
        "你理解错了",
        "你理解有误",
        "重试一下",
        "重新来",
        "换一种写法",
        "改用 Postgres",
    ],
)
def test_every_correction_pattern_fires(text: str) -> None:
    assert is_correction(text) is True


@pytest.mark.parametrize(
    "text",
    ["it was redone yesterday", "the retry worked", "the asymmetric 不对等 terms", "hello"],
)
def test_no_correction(text: str) -> None:
    assert is_correction(text) is False


@pytest.mark.parametrize(
    "text",
    [
        "yes exactly",
        "Yes, perfect",
        "yes that is correct",
        "Perfect.",
        "exactly right",
        "that's what i needed",
        "that is exactly correct",
        "keep doing that",
        "keep that",
        "just like that",
        "this is helpful!",
        "this is what I wanted.",
        "对，就是这样！",
        "完全正确",
        "就是这个意思。",
        "对, 就是这个意思",
        "正是我想要的",
        "继续保持！",
    ],
)
def test_every_reinforcement_pattern_fires(text: str) -> None:
    assert is_reinforcement(text) is True


def test_every_new_user_message_counts() -> None:
    """The new part of a conversation is searched whole, however long: no window."""
    assert signals_in(turn("that's wrong", *"abcdefgh")) == (True, False)
    assert signals_in(turn("perfect!", *"abcdefgh")) == (False, True)


def test_assistant_messages_are_not_searched() -> None:
    messages = [Message("user", "hi"), Message("assistant", "That's wrong, try again")]
    assert signals_in(messages) == (False, False)


def test_correction_suppresses_reinforcement() -> None:
    assert signals_in(turn("perfect!", "no, that's wrong")) == (True, False)
    assert signals_in(turn("perfect!")) == (False, True)
    assert signals_in(turn("hello")) == (False, False)


WORDS = [
    "that's", "that’s", "that", "is", "wrong", "incorrect", "you", "misunderstood", "try", "again",
    "redo", "yes", "Yes,", "exactly", "perfect", "Perfect!", "right", "correct", "what", "i",
    "wanted", "keep", "doing", "just", "like", "this", "great.", "helpful", "later", "let", "me",
    "不对", "你理解错了", "重试", "改用", "对，", "就是这样", "完全正确。", "继续保持", "。", "\n",
]  # fmt: skip


@given(st.lists(st.sampled_from(WORDS), max_size=8).map(" ".join))
def test_trigger_prefilter_never_hides_a_match(text: str) -> None:
    """The cheap substring pre-check must agree with searching every pattern."""
    text = text.strip()  # the detectors search the stripped text
    full_correction = any(
        re.search(p, text, re.IGNORECASE) for p in CORRECTION_PATTERNS_EN + CORRECTION_PATTERNS_ZH
    )
    full_reinforcement = any(
        re.search(p, text, re.IGNORECASE)
        for p in REINFORCEMENT_PATTERNS_EN + REINFORCEMENT_PATTERNS_ZH
    )
    if text:
        assert is_correction(text) is full_correction
        assert is_reinforcement(text) is full_reinforcement
