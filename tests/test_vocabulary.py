"""The fact vocabulary is one rule on every path: duplicates, categories, confidence, evictions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from memq.core.errors import InvalidMemoryData
from memq.core.settings import MemqSettings
from memq.memory.apply import apply_update
from memq.memory.staleness import stale_candidates
from memq.memory.update import NewFact, UpdateAnswer
from prompts.injection import format_memory_for_injection
from storage import get_storage
from storage.cap import eviction_change
from storage.document import Fact, MemoryDocument
from storage.fact_input import DuplicateFact
from storage.management import MemoryManager
from storage.vocabulary import content_key, normalise_category, parse_confidence

NOW = datetime(2026, 7, 15, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.integration)])
def manager(request: pytest.FixtureRequest, make_settings: Any) -> MemoryManager:
    return MemoryManager(get_storage(make_settings(storage=request.param)), max_facts=10)


def test_a_hand_added_duplicate_differing_in_whitespace_is_refused(manager: MemoryManager) -> None:
    """The management API (and the DeerFlow backend's create_fact, which calls it) accepted
    "Likes  green tea" beside "likes green tea"; an extraction already saw them as one fact."""
    manager.add_fact("alice_example_com", "likes green tea")
    with pytest.raises(DuplicateFact):
        manager.add_fact("alice_example_com", "  Likes \t green   TEA ", reject_duplicate=True)
    assert [f.content for f in manager.list_facts("alice_example_com")] == ["likes green tea"]
    extracted = apply_update(
        MemoryDocument(facts=[Fact(content="likes green tea")]),
        UpdateAnswer(new_facts=(NewFact(content="Likes  green tea", confidence=0.9),)),
        settings=MemqSettings(llm_provider="rules"),
        now=NOW,
    )
    assert len(extracted.document.facts) == 1
    assert content_key("Likes  green tea") == content_key("likes green tea\n")


def test_a_hand_added_correction_is_a_correction_everywhere(manager: MemoryManager) -> None:
    """``category="Correction"`` was stored as an unknown category: the cap evicted it like any
    other fact and injection did not guarantee it, while staleness protected it."""
    fact = manager.add_fact("bob", "Use uv, not pip", category=" Correction ", confidence=0.1)
    assert fact.category == "correction"
    for i in range(12):  # over the cap of 10 with facts of higher confidence
        manager.add_fact("bob", f"fact number {i}", confidence=0.5 + i / 30)
    kept = manager.list_facts("bob")
    assert "Use uv, not pip" in [f.content for f in kept]
    document = manager.document("bob")
    injected = format_memory_for_injection(document, max_tokens=60, guaranteed_token_budget=30)
    assert "Use uv, not pip" in injected
    edited = manager.edit_fact("bob", fact.id, category="Preferences")
    assert edited.category == "preference"


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        ("Correction", "correction"),
        ("GOALS", "goal"),
        ("  knowledge ", "knowledge"),
        ("favourite things", "favourite things"),  # DeerFlow's free categories are kept
        ("", "context"),
        (None, "context"),
        (7, "context"),
    ],
)
def test_one_category_rule_for_stored_facts(raw: Any, stored: str) -> None:
    assert normalise_category(raw) == stored
    assert Fact.model_validate({"content": "x", "category": raw}).category == stored


def test_protected_categories_match_however_they_are_spelt() -> None:
    settings = MemqSettings(
        llm_provider="rules", staleness_protected_categories=("Goals",), staleness_age_days=1
    )
    old = datetime(2020, 1, 1, tzinfo=UTC)
    document = MemoryDocument(
        facts=[
            Fact(content="ship v2", category="goal", created_at=old),
            Fact(content="likes tea", category="preference", created_at=old),
        ]
    )
    assert [f.content for f in stale_candidates(document, settings, NOW)] == ["likes tea"]


@pytest.mark.parametrize(
    ("raw", "clamped", "strict"),
    [
        (0.8, 0.8, 0.8),
        (" 0.8 ", 0.8, 0.8),
        (1.5, 1.0, None),
        (-2, 0.0, None),
        (None, None, None),
        (True, None, None),
        ("high", None, None),
        ("NaN", None, None),
        (float("inf"), None, None),
        ([0.9], None, None),
    ],
)
def test_one_confidence_rule(raw: Any, clamped: float | None, strict: float | None) -> None:
    assert parse_confidence(raw) == clamped
    assert parse_confidence(raw, clamp=False) == strict
    # A stored fact never loses itself over an unreadable confidence.
    stored = Fact.model_validate({"content": "x", "confidence": raw}).confidence
    assert stored == (0.5 if clamped is None else clamped)


def test_hand_entered_confidence_is_refused_not_clamped(manager: MemoryManager) -> None:
    for bad in (1.5, "0.9", float("nan"), True):
        with pytest.raises(InvalidMemoryData):
            manager.add_fact("carol", "x", confidence=bad)  # type: ignore[arg-type]


def test_both_paths_record_an_eviction_the_same_way(manager: MemoryManager) -> None:
    """The eviction entry was written twice, by the extraction and by hand edits."""
    for i in range(10):
        manager.add_fact("dave", f"kept {i}", confidence=0.9)
    # the newest of equals goes first, so the hand add evicts "kept 9"
    manager.add_fact("dave", "newest", confidence=0.95)
    (by_hand,) = [c for c in manager.history("dave") if c.action == "evict"]
    settings = MemqSettings(llm_provider="rules", max_facts=10)
    document = MemoryDocument(facts=[Fact(content=f"kept {i}", confidence=0.9) for i in range(10)])
    extracted = apply_update(
        document,
        UpdateAnswer(new_facts=(NewFact(content="newest", confidence=0.95),)),
        settings=settings,
        now=NOW,
    )
    (by_extraction,) = [c for c in extracted.changes if c.action == "evict"]
    assert (
        by_hand.reason
        == by_extraction.reason
        == eviction_change(Fact(content="x", confidence=0.9), 10).reason
    )
