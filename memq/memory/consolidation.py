"""Consolidation (off by default): large groups of same-category facts are shown to the model,
which may merge related ones into a single richer fact (the prompt section: ``prompts.review``).

Guardrails: only facts of a qualifying group in the latest document may be merged, all sources of
one merge share a category, a source is consumed at most once per cycle, at most
``consolidation_max_groups_per_cycle`` merges succeed, and the merged confidence is never above its
best source (nor below the fact threshold).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from memq.core.settings import MemqSettings
from memq.memory.update import ConsolidationProposal
from storage.document import Fact, MemoryDocument, new_fact_id
from storage.provenance import merged_sources
from storage.vocabulary import category_set


@dataclass(frozen=True)
class Group:
    category: str
    facts: tuple[Fact, ...]


@dataclass
class ConsolidationResult:
    merged: list[Fact] = field(default_factory=list)
    consumed: dict[str, str] = field(default_factory=dict)  # source id → merged fact id


def qualifying_groups(document: MemoryDocument, settings: MemqSettings) -> list[Group]:
    """Categories with at least ``consolidation_min_facts`` facts, largest first (then by name)."""
    protected = category_set(settings.staleness_protected_categories)
    groups: dict[str, list[Fact]] = {}
    for fact in document.facts:
        if fact.category not in protected:
            groups.setdefault(fact.category, []).append(fact)
    qualifying = [
        Group(name, tuple(facts))
        for name, facts in groups.items()
        if len(facts) >= settings.consolidation_min_facts
    ]
    qualifying.sort(key=lambda g: (-len(g.facts), g.category))
    return qualifying


def apply_consolidations(
    document: MemoryDocument,
    proposals: Sequence[ConsolidationProposal],
    settings: MemqSettings,
    now: datetime,
) -> ConsolidationResult:
    """Decide which proposed merges to make on ``document``; the caller swaps the facts."""
    result = ConsolidationResult()
    if not proposals:
        return result
    allowed = {f.id: f for g in qualifying_groups(document, settings) for f in g.facts}
    for proposal in proposals:
        if len(result.merged) >= settings.consolidation_max_groups_per_cycle:
            break
        ids = proposal.source_ids
        if not 2 <= len(ids) <= settings.consolidation_max_sources:
            continue
        if any(i in result.consumed or i not in allowed for i in ids):
            continue
        sources = [allowed[i] for i in ids]
        if len({s.category for s in sources}) != 1:
            continue
        best = max(s.confidence for s in sources)
        confidence = best if proposal.confidence is None else min(proposal.confidence, best)
        if confidence < settings.fact_confidence_threshold:
            continue
        created = [s.created_at for s in sources if s.created_at is not None]
        said = [s.said_at for s in sources if s.said_at is not None]
        errors = list(dict.fromkeys(s.source_error for s in sources if s.source_error))
        merged = Fact(
            id=new_fact_id(),
            content=proposal.content,
            # The sources share one category and a merge does not change what kind of fact it
            # is; taking the model's label could promote facts into a protected category.
            category=sources[0].category,
            confidence=confidence,
            created_at=max(created) if created else now,
            source="consolidation",
            consolidated_at=now,
            consolidated_from=list(ids),
            source_error="\n".join(errors) or None,
            sources=merged_sources(sources, settings.fact_max_sources),
            # The latest time one of them was said: what the merged statement is as of.
            said_at=max(said) if said else None,
        )
        result.merged.append(merged)
        result.consumed.update(dict.fromkeys(ids, merged.id))
    return result
