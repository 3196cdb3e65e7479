"""copy_document: a private copy, equal to the original and sharing nothing that can change."""

from __future__ import annotations

from datetime import UTC, datetime

from storage.document import Fact, MemoryDocument, SupersededFact, copy_document
from storage.sections import Section
from storage.sources import Source

AT = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def rich_document() -> MemoryDocument:
    fact = Fact(
        content="Lives in Munich",
        category="context",
        confidence=0.9,
        consolidated_from=["fact_a", "fact_b"],
        sources=[Source(thread_id="t1", messages=["m1"], run_id="r1", at=AT)],
    )
    document = MemoryDocument(facts=[fact, Fact(content="Likes tea", confidence=0.7)])
    document.user.work_context = Section(summary="Backend engineer", updated_at=AT)
    document.superseded = [SupersededFact(fact=Fact(content="Lived in Berlin", confidence=0.8))]
    return document


def test_a_copy_is_equal_and_saves_the_same_text() -> None:
    original = rich_document()
    copy = copy_document(original)
    assert copy == original
    assert copy.model_dump_json() == original.model_dump_json()


def test_changing_every_mutable_part_of_a_copy_leaves_the_original_alone() -> None:
    original = rich_document()
    snapshot = original.model_dump()
    copy = copy_document(original)
    copy.facts[0].content = "Lives in Berlin"
    copy.facts[0].consolidated_from.append("fact_c")
    copy.facts[0].sources.append(Source(thread_id="t2", messages=["m9"], run_id="r2", at=AT))
    copy.facts.pop()
    copy.user.work_context.summary = "Manager"
    copy.history.recent_months.summary = "Moved"
    copy.superseded.clear()
    assert original.model_dump() == snapshot


def test_a_copy_still_validates_what_is_assigned_to_it() -> None:
    """Assignments are validated (and sloppy values repaired) on a copy as on the original."""
    original, copy = rich_document(), copy_document(rich_document())
    for fact in (original.facts[0], copy.facts[0]):
        fact.confidence = "very"  # type: ignore[assignment]
        fact.sources = [1]  # type: ignore[list-item]
    assert copy.facts[0].confidence == original.facts[0].confidence
    assert copy.facts[0].sources == original.facts[0].sources == []
