"""A slice of a large memory for the update prompt: past a token budget, only the facts the new
messages are about, plus the protected categories, in the document's own order.

A user's memory grows to thousands of tokens and every extraction used to carry all of it. Past
``memory_slice_max_tokens``, the prompt shows the protected categories (corrections: the model must
never contradict them unseen) and then the facts most relevant to the new messages (the same BM25
ranking recall uses, blended with confidence) until the budget is spent. Shown facts keep their
document order (old before new), so consecutive extractions still share a cacheable prefix. The
model can only remove or merge facts it was shown; an exact duplicate of a fact left out is still
caught when the answer is applied (deduplication runs against the whole document), a fact the model
restates in other words is not.
"""

from __future__ import annotations

from collections.abc import Sequence

from prompts.tokens import TokenCounter
from storage.document import Fact, MemoryDocument
from storage.search import rank_by_relevance
from storage.vocabulary import category_set

FACT_OVERHEAD_TOKENS = 24  # the JSON around one fact's content: id, category, confidence, dates


def fact_tokens(fact: Fact, count_tokens: TokenCounter) -> int:
    return count_tokens(fact.content) + FACT_OVERHEAD_TOKENS


def slice_facts(
    facts: Sequence[Fact],
    query: str,
    *,
    max_tokens: int,
    protected: Sequence[str],
    count_tokens: TokenCounter,
) -> list[Fact]:
    """The facts to show: all of them when they fit ``max_tokens``, else the protected ones and
    then the most relevant to ``query`` while they fit; in document order either way.
    ``protected`` names categories as the settings do (`Corrections`): read with the one
    normaliser stored facts' categories went through."""
    guard = category_set(protected)
    if sum(fact_tokens(f, count_tokens) for f in facts) <= max_tokens:
        return list(facts)
    chosen: set[str] = set()
    spent = 0
    guarded = [f for f in facts if f.category in guard]
    for fact in [*guarded, *rank_by_relevance(facts, query)]:
        if fact.id in chosen:
            continue
        cost = fact_tokens(fact, count_tokens)
        if spent + cost > max_tokens and fact.category not in guard:
            continue
        chosen.add(fact.id)
        spent += cost
    return [f for f in facts if f.id in chosen]


def sliced_memory(
    memory: MemoryDocument,
    query: str,
    *,
    max_tokens: int | None,
    protected: Sequence[str],
    count_tokens: TokenCounter,
) -> tuple[MemoryDocument, int]:
    """The memory as the prompt shows it and how many facts were left out (0: all shown)."""
    if max_tokens is None:
        return memory, 0
    shown = slice_facts(
        memory.facts, query, max_tokens=max_tokens, protected=protected, count_tokens=count_tokens
    )
    if len(shown) == len(memory.facts):
        return memory, 0
    return memory.model_copy(update={"facts": shown}), len(memory.facts) - len(shown)
