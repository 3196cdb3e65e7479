"""What an extraction costs: the prompt cache key it is sent with, and its price in dollars.

Pure functions on typed data. The cache key is stable per (deployment, user, agent), so the
provider routes one user's consecutive extractions to the same prompt cache; it is a hash, so no
user id leaves for the provider in it. The price table turns a call's usage (prompt tokens, of
which cached, and completion tokens) into dollars; flex and batch calls get the batch discount.
Costs are added up as whole nano-dollars (integers add exactly in a Redis hash).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from memq.core.metrics import NANO_USD_PER_USD
from memq.core.settings import MemqSettings

# Service tiers billed at batch prices.
DISCOUNTED_TIERS = frozenset({"flex", "batch"})


def prompt_cache_key(key_prefix: str, user_id: str, agent_name: str | None) -> str:
    """A stable, opaque key per (deployment, user, agent): the same on every call and process."""
    material = "\x1f".join((key_prefix, user_id, agent_name or ""))
    return "memq-" + hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class CallUsage:
    """Token usage of one model call, as the provider reported it."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, read from the provider's prompt cache
    completion_tokens: int = 0
    service_tier: str = ""  # the tier that served it ("" when the provider does not say)


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Dollars per million tokens; ``batch_discount`` is the share taken off flex and batch."""

    input_per_million: float
    cached_input_per_million: float
    output_per_million: float
    batch_discount: float = 0.5

    @classmethod
    def from_settings(cls, settings: MemqSettings) -> PriceTable | None:
        """The configured table; None when no input price is set (no bill is kept)."""
        if settings.llm_price_input_per_million is None:
            return None
        cached = settings.llm_price_cached_input_per_million
        return cls(
            input_per_million=settings.llm_price_input_per_million,
            cached_input_per_million=(
                settings.llm_price_input_per_million if cached is None else cached
            ),
            output_per_million=settings.llm_price_output_per_million or 0.0,
            batch_discount=settings.llm_batch_discount,
        )

    def cost_usd(self, usage: CallUsage) -> float:
        cached = min(max(usage.cached_tokens, 0), max(usage.prompt_tokens, 0))
        fresh = max(usage.prompt_tokens, 0) - cached
        dollars = (
            fresh * self.input_per_million
            + cached * self.cached_input_per_million
            + max(usage.completion_tokens, 0) * self.output_per_million
        ) / 1_000_000
        if usage.service_tier in DISCOUNTED_TIERS:
            dollars *= 1 - self.batch_discount
        return dollars

    def cost_nano_usd(self, usage: CallUsage) -> int:
        return round(self.cost_usd(usage) * NANO_USD_PER_USD)


def cost_nano_usd(prices: PriceTable | None, usage: CallUsage) -> int:
    """The call's cost in nano-dollars; 0 without a price table."""
    return 0 if prices is None else prices.cost_nano_usd(usage)


def bill_fields(prices: PriceTable | None, usage: CallUsage, turns: int) -> dict[str, int]:
    """What one answered call adds to the bill's counters, whichever lane sent it: its cost, one
    billed run (a call that sent a prompt), and the conversation messages it extracted."""
    return {
        "cost_nano_usd": cost_nano_usd(prices, usage),
        "billed_runs": int(usage.prompt_tokens > 0),
        "turns_extracted": turns,
    }
