"""Staleness review and consolidation: candidates, prompt sections and the apply guardrails."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from memq.core.settings import MemqSettings
from memq.memory.apply import apply_update
from memq.memory.consolidation import qualifying_groups
from memq.memory.staleness import stale_candidates
from memq.memory.update import ConsolidationProposal, StaleRemoval, UpdateAnswer
from prompts.review import render_staleness_section
from storage.document import Fact, MemoryDocument

NOW = datetime(2026, 7, 15, tzinfo=UTC)


def settings(**overrides: Any) -> MemqSettings:
    return MemqSettings(llm_provider="rules", **overrides)


def aged(fid: str, days: float, confidence: float = 0.8, category: str = "context") -> Fact:
    return Fact(
        id=fid,
        content=f"fact {fid}",
        category=category,
        confidence=confidence,
        created_at=NOW - timedelta(days=days),
    )


def test_defaults_match_deerflow() -> None:
    config = settings()
    assert config.staleness_review_enabled and not config.consolidation_enabled
    assert (config.staleness_age_days, config.staleness_min_candidates) == (90, 3)
    assert config.staleness_max_removals_per_cycle == 10
    assert config.staleness_protected_categories == ("correction",)
    assert (config.consolidation_min_facts, config.consolidation_max_groups_per_cycle) == (8, 3)


def test_candidates_are_strictly_older_unprotected_and_dated() -> None:
    doc = MemoryDocument(
        facts=[
            aged("exactly90", 90),
            aged("old", 91),
            aged("correction", 400, category="correction"),
            Fact(id="undated", content="x", created_at=None),
            aged("older", 300),
        ]
    )
    assert [f.id for f in stale_candidates(doc, settings(), NOW)] == ["older", "old"]


def test_section_lists_at_most_the_configured_number_oldest_first() -> None:
    doc = MemoryDocument(facts=[aged(f"f{d}", d) for d in range(100, 130)])
    config = settings(staleness_max_candidates_shown=5)
    candidates = stale_candidates(doc, config, NOW)
    assert [f.id for f in candidates] == ["f129", "f128", "f127", "f126", "f125"]
    section = render_staleness_section(candidates, config)
    assert section.count("\n- [") == 5 and "| 0.80 |" in section
    assert "staleFactsToRemove" in section


def test_stale_removals_keep_to_candidates_and_the_per_cycle_cap() -> None:
    doc = MemoryDocument(
        facts=[
            aged("a", 200, 0.9),
            aged("b", 200, 0.5),
            aged("c", 200, 0.7),
            aged("young", 5),
            aged("fix", 300, category="correction"),
        ]
    )
    answer = UpdateAnswer(
        stale_facts_to_remove=tuple(
            StaleRemoval(id=i, reason="moved on") for i in ("a", "b", "c", "young", "fix", "nope")
        )
    )
    result = apply_update(
        doc, answer, settings=settings(staleness_max_removals_per_cycle=2), now=NOW
    )
    assert sorted(f.id for f in result.document.facts) == ["a", "fix", "young"]
    stale = [c for c in result.changes if c.action == "stale"]
    assert [c.fact_id for c in stale] == ["b", "c"]  # lowest confidence first
    assert all("moved on" in c.reason for c in stale)


def test_stale_removal_applies_even_with_review_disabled_but_never_to_protected() -> None:
    doc = MemoryDocument(facts=[aged("a", 200)])
    answer = UpdateAnswer(stale_facts_to_remove=(StaleRemoval(id="a"),))
    result = apply_update(doc, answer, settings=settings(staleness_review_enabled=False), now=NOW)
    assert result.document.facts == []


def prefs(n: int, category: str = "preference", confidence: float = 0.8) -> list[Fact]:
    return [
        Fact(
            id=f"{category[:1]}{i}",
            content=f"{category} {i}",
            category=category,
            confidence=confidence,
            created_at=NOW - timedelta(days=i),
        )
        for i in range(n)
    ]


def merge(
    *ids: str, confidence: float | None = 0.95, category: str | None = None
) -> ConsolidationProposal:
    return ConsolidationProposal(
        source_ids=ids, content="merged " + "+".join(ids), confidence=confidence, category=category
    )


def test_groups_qualify_by_size_and_skip_protected_categories() -> None:
    doc = MemoryDocument(
        facts=prefs(9) + prefs(8, "goal") + prefs(7, "knowledge") + prefs(12, "correction")
    )
    assert [g.category for g in qualifying_groups(doc, settings())] == ["preference", "goal"]


def test_consolidation_merges_with_confidence_capped_by_its_sources() -> None:
    doc = MemoryDocument(facts=prefs(9))
    doc.facts[0].confidence = 0.85
    doc.facts[0].source_error = "err A"
    doc.facts[1].source_error = "err B"
    answer = UpdateAnswer(facts_to_consolidate=(merge("p0", "p1", "p2"),))
    result = apply_update(doc, answer, settings=settings(consolidation_enabled=True), now=NOW)
    merged = result.document.facts[-1]
    assert merged.content == "merged p0+p1+p2" and merged.source == "consolidation"
    assert merged.confidence == 0.85  # never above the best source
    assert merged.consolidated_from == ["p0", "p1", "p2"] and merged.consolidated_at == NOW
    assert merged.created_at == NOW  # the newest source (p0, 0 days old)
    assert merged.source_error == "err A\nerr B"
    assert merged.category == "preference"
    assert len(result.document.facts) == 7
    assert [c.action for c in result.changes].count("merge") == 1


def test_consolidation_guardrails() -> None:
    doc = MemoryDocument(facts=prefs(9) + prefs(8, "goal") + prefs(8, "correction"))
    config = settings(consolidation_enabled=True, consolidation_max_groups_per_cycle=2)
    answer = UpdateAnswer(
        facts_to_consolidate=(
            merge("p0", "missing"),  # unknown id
            merge("p0", "c0"),  # a protected correction
            merge("p0", "g0"),  # across categories
            merge("p1", "p2", confidence=0.5),  # below the fact threshold
            merge("p3", "p4"),  # ok
            merge("p4", "p5"),  # p4 already consumed this cycle
            merge("g1", "g2", confidence=None),  # ok: takes the best source's confidence
            merge("p6", "p7"),  # over the per-cycle cap
        )
    )
    result = apply_update(doc, answer, settings=config, now=NOW)
    merged = [f for f in result.document.facts if f.source == "consolidation"]
    assert [f.consolidated_from for f in merged] == [["p3", "p4"], ["g1", "g2"]]
    assert merged[1].confidence == 0.8


def test_consolidation_is_ignored_when_disabled() -> None:
    doc = MemoryDocument(facts=prefs(9))
    answer = UpdateAnswer(facts_to_consolidate=(merge("p0", "p1"),))
    assert apply_update(doc, answer, settings=settings(), now=NOW).document == doc


def test_a_merge_keeps_its_sources_category_whatever_the_model_labels_it() -> None:
    doc = MemoryDocument(facts=prefs(9))
    answer = UpdateAnswer(facts_to_consolidate=(merge("p0", "p1", category="correction"),))
    result = apply_update(doc, answer, settings=settings(consolidation_enabled=True), now=NOW)
    [merged] = [f for f in result.document.facts if f.source == "consolidation"]
    assert merged.category == "preference"  # never promoted into the protected category
