"""The caps on facts: which facts go when a document holds more than ``max_facts``, and how long
one fact may be (``fact_max_chars``).

Pure functions, shared by the extraction's apply step, hand edits and imports, so a fact added
by hand or imported is held to the same caps (and the same eviction order) as one an extraction
learned.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from memq.core.settings import MemqSettings
from storage.base import Change
from storage.document import Fact, utc_now
from storage.vocabulary import CORRECTION

# For callers without settings at hand (a manager built on a bare storage): the settings' default.
DEFAULT_FACT_MAX_CHARS = int(MemqSettings.model_fields["fact_max_chars"].default)
# The free-text fields of a fact that are rendered into every prompt.
FACT_TEXT_FIELDS = ("content", "source_error")
CUT_MARK = "…"


def cap_fact_length(fact: Fact, max_chars: int) -> tuple[Fact, tuple[str, ...]]:
    """``fact`` with each text field over ``max_chars`` characters cut to that length (the cut ends
    in "…"), and the names of the fields it cut. The input is not modified; a fact within the
    limit comes back as is.

    Every door a fact comes in by uses this one function: extraction and import keep the cut fact,
    the management API refuses the fact, naming the fields.
    """
    over = tuple(name for name in FACT_TEXT_FIELDS if len(getattr(fact, name) or "") > max_chars)
    if not over:
        return fact, ()
    cut = {name: getattr(fact, name)[: max_chars - len(CUT_MARK)] + CUT_MARK for name in over}
    return fact.model_copy(update=cut), over


def cap_facts_length(facts: Iterable[Fact], max_chars: int) -> tuple[list[Fact], int]:
    """Every fact through :func:`cap_fact_length`; returns them and how many were cut."""
    out: list[Fact] = []
    cut = 0
    for fact in facts:
        capped, over = cap_fact_length(fact, max_chars)
        out.append(capped)
        cut += bool(over)
    return out, cut


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
