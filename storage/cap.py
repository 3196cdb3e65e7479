"""The fact cap of a memory document: which facts go when there are more than ``max_facts``.

A pure function of the fact list, shared by the extraction's apply step and by hand edits, so a fact
added by hand is held to the same cap (and the same eviction order) as one an extraction learned.
"""

from __future__ import annotations

from datetime import datetime

from storage.base import Change
from storage.document import CORRECTION, Fact, utc_now


def evict_over_cap(facts: list[Fact], max_facts: int) -> tuple[list[Fact], list[Fact]]:
    """(kept in their order, evicted). Lowest confidence goes first, the newest on ties, and a
    correction only once no other category is left to evict."""
    if len(facts) <= max_facts:
        return facts, []
    ranked = sorted(
        range(len(facts)),
        key=lambda i: (facts[i].category == CORRECTION, facts[i].confidence, -i),
        reverse=True,
    )
    keep = set(ranked[:max_facts])
    return (
        [f for i, f in enumerate(facts) if i in keep],
        [f for i, f in enumerate(facts) if i not in keep],
    )


def eviction_change(
    fact: Fact, max_facts: int, *, at: datetime | None = None, thread_id: str | None = None
) -> Change:
    """The history entry of one fact the cap evicted, whichever path applied the cap."""
    return Change(
        at=at or utc_now(),
        action="evict",
        fact_id=fact.id,
        content=fact.content,
        reason=f"over max_facts={max_facts}, lowest confidence ({fact.confidence:.2f})",
        source_thread_id=thread_id,
    )
