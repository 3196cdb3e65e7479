"""Applying a parsed answer to the latest document: summaries, removals (and the protection of
corrections), threshold, dedup, the cap, provenance and the change record."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from memq.core.settings import MemqSettings
from memq.memory.apply import apply_update
from memq.memory.update import NewFact, SectionUpdate, UpdateAnswer
from storage.cap import evict_over_cap
from storage.document import Fact, MemoryDocument
from storage.sections import Section, UserContext
from tests.support.documents import contents

NOW = datetime(2026, 7, 15, 12, 0, tzinfo=UTC)
EARLIER = datetime(2026, 1, 1, tzinfo=UTC)


def settings(**overrides: Any) -> MemqSettings:
    return MemqSettings(llm_provider="rules", **overrides)


def new(content: str, confidence: float = 0.9, category: str = "context", **kw: Any) -> NewFact:
    return NewFact(content=content, confidence=confidence, category=category, **kw)


def fact(fid: str, content: str, confidence: float = 0.9, category: str = "context") -> Fact:
    return Fact(
        id=fid, content=content, confidence=confidence, category=category, created_at=EARLIER
    )


def apply(doc: MemoryDocument, answer: UpdateAnswer, **overrides: Any) -> Any:
    return apply_update(doc, answer, settings=settings(**overrides), now=NOW, thread_id="t-1")


def test_summaries_replaced_only_when_flagged_and_non_blank() -> None:
    doc = MemoryDocument(user=UserContext(work_context=Section(summary="old", updated_at=EARLIER)))
    answer = UpdateAnswer(
        sections={
            "work_context": SectionUpdate(summary="Engineer at Acme", should_update=True),
            "personal_context": SectionUpdate(summary="Speaks French", should_update=False),
            "top_of_mind": SectionUpdate(summary="", should_update=True),
        }
    )
    result = apply(doc, answer)
    assert result.document.user.work_context.summary == "Engineer at Acme"
    assert result.document.user.work_context.updated_at == NOW
    assert result.document.user.personal_context.summary == ""
    assert [(c.action, c.section) for c in result.changes] == [("summary", "work_context")]
    assert result.document.last_updated == NOW
    assert doc.user.work_context.summary == "old"  # the input is never modified


def test_new_facts_carry_provenance_and_pass_the_threshold_inclusively() -> None:
    answer = UpdateAnswer(
        new_facts=(
            new("Uses Rust", 0.7, "knowledge"),
            new("Maybe likes Go", 0.69),
            new("Use uv not pip", 0.95, "correction", source_error="used pip"),
        )
    )
    result = apply(MemoryDocument(), answer)
    added = {f.content: f for f in result.document.facts}
    assert set(added) == {"Uses Rust", "Use uv not pip"}
    rust = added["Uses Rust"]
    assert rust.id.startswith("fact_") and len(rust.id) == 13
    assert rust.created_at == NOW and rust.source == "conversation"
    assert rust.source_thread_id == "t-1"
    assert added["Use uv not pip"].source_error == "used pip"
    assert [c.action for c in result.changes] == ["add", "add"]


def test_dedup_ignores_case_and_whitespace_against_existing_and_same_batch() -> None:
    doc = MemoryDocument(facts=[fact("f1", "Prefers  dark mode")])
    answer = UpdateAnswer(
        new_facts=(new("prefers dark   MODE"), new("Likes tea"), new("  likes TEA "))
    )
    result = apply(doc, answer)
    assert contents(result.document) == ["Prefers  dark mode", "Likes tea"]


def test_removal_then_same_content_refreshes_the_fact() -> None:
    doc = MemoryDocument(facts=[fact("f1", "Lives in Paris", 0.8)])
    result = apply(doc, UpdateAnswer(facts_to_remove=("f1",), new_facts=(new("Lives in Paris"),)))
    (refreshed,) = result.document.facts
    assert refreshed.id != "f1" and refreshed.created_at == NOW


def test_removals_of_ids_that_no_longer_exist_are_no_ops() -> None:
    doc = MemoryDocument(facts=[fact("f1", "Likes tea")])
    result = apply(doc, UpdateAnswer(facts_to_remove=("gone", "also_gone")))
    assert contents(result.document) == ["Likes tea"] and result.changes == []
    assert result.unknown_removals == 2


def test_a_placeholder_id_copied_from_the_instructions_is_ignored_and_counted() -> None:
    doc = MemoryDocument(facts=[fact("f1", "Uses npm")])
    answer = UpdateAnswer(new_facts=(new("Uses pnpm"),), facts_to_remove=("<fact id>", "f1"))
    result = apply(doc, answer)
    assert contents(result.document) == ["Uses pnpm"]
    assert result.unknown_removals == 1


def test_contradiction_cannot_delete_a_correction_without_a_replacement() -> None:
    doc = MemoryDocument(
        facts=[fact("c1", "Use pnpm, not npm", 0.95, "correction"), fact("f2", "Uses npm")]
    )
    refused = apply(doc, UpdateAnswer(facts_to_remove=("c1", "f2")))
    assert contents(refused.document) == ["Use pnpm, not npm"]
    assert [(c.action, c.fact_id) for c in refused.changes] == [("supersede", "f2")]
    replaced = apply(
        doc,
        UpdateAnswer(facts_to_remove=("c1",), new_facts=(new("Use bun", 0.95, "correction"),)),
    )
    assert contents(replaced.document) == ["Uses npm", "Use bun"]


def test_cap_evicts_lowest_confidence_newest_first_and_corrections_last() -> None:
    facts = [
        fact("c1", "correction low", 0.1, "correction"),
        fact("a", "a", 0.5),
        fact("b", "b", 0.9),
        fact("c", "c", 0.5),
    ]
    kept, evicted = evict_over_cap(facts, 2)
    assert [f.id for f in kept] == ["c1", "b"]  # order preserved
    assert [f.id for f in evicted] == ["a", "c"]
    kept, evicted = evict_over_cap(facts, 3)
    assert [f.id for f in evicted] == ["c"]  # equal confidence: the later one goes first
    only_corrections = [fact(f"c{i}", f"c{i}", i / 10, "correction") for i in range(3)]
    kept, evicted = evict_over_cap(only_corrections, 2)
    assert [f.id for f in evicted] == ["c0"]


def test_cap_applies_after_adding_and_records_evictions() -> None:
    doc = MemoryDocument(facts=[fact(f"f{i}", f"fact {i}", 0.8) for i in range(10)])
    answer = UpdateAnswer(new_facts=(new("strong", 0.99), new("weak", 0.7)))
    result = apply(doc, answer, max_facts=10)
    assert len(result.document.facts) == 10
    assert "strong" in contents(result.document) and "weak" not in contents(result.document)
    evictions = [c for c in result.changes if c.action == "evict"]
    assert [c.content for c in evictions] == ["fact 9", "weak"]
    assert all("max_facts=10" in c.reason for c in evictions)


def test_upload_mentions_are_scrubbed_after_applying() -> None:
    answer = UpdateAnswer(
        sections={
            "top_of_mind": SectionUpdate(
                summary="User uploaded the Q3 report file. Wants a churn analysis.",
                should_update=True,
            )
        },
        new_facts=(
            new("Uploaded data.csv to /mnt/user-data/uploads/data.csv"),
            new("Works with CSV files"),
        ),
    )
    result = apply(MemoryDocument(), answer)
    assert result.document.user.top_of_mind.summary == "Wants a churn analysis."
    assert contents(result.document) == ["Works with CSV files"]
    assert any(c.action == "remove" and "upload" in c.reason for c in result.changes)


def test_empty_answer_changes_nothing() -> None:
    doc = MemoryDocument(facts=[fact("f1", "Likes tea")])
    result = apply(doc, UpdateAnswer())
    assert result.changes == [] and result.document.last_updated is None
    assert result.document == doc


def _corrections() -> MemoryDocument:
    return MemoryDocument(
        facts=[
            fact("c1", "Run the app with make dev", 0.95, "correction"),
            fact("c2", "Use uv, not pip", 0.95, "correction"),
            fact("c3", "Never push to main", 0.95, "correction"),
        ]
    )


def test_a_duplicate_replacement_does_not_license_removing_a_correction() -> None:
    answer = UpdateAnswer(
        facts_to_remove=("c1",), new_facts=(new("use UV,  not pip", 0.95, "correction"),)
    )
    result = apply(_corrections(), answer)
    assert [f.id for f in result.document.facts] == ["c1", "c2", "c3"]
    assert result.changes == []


def test_one_replacement_removes_at_most_one_correction() -> None:
    answer = UpdateAnswer(
        facts_to_remove=("c1", "c2", "c3"), new_facts=(new("Be nice", 0.95, "correction"),)
    )
    result = apply(_corrections(), answer)
    assert contents(result.document) == ["Use uv, not pip", "Never push to main", "Be nice"]
    (added,) = [c for c in result.changes if c.action == "add"]
    (removed,) = [c for c in result.changes if c.action == "supersede"]
    assert removed.fact_id == "c1" and added.fact_id is not None
    assert added.fact_id in removed.reason


def test_a_replacement_dropped_by_the_upload_scrub_removes_no_correction() -> None:
    answer = UpdateAnswer(
        facts_to_remove=("c1",),
        new_facts=(new("Run the app with the script from the uploaded file", 0.95, "correction"),),
    )
    result = apply(_corrections(), answer)
    assert [f.id for f in result.document.facts] == ["c1", "c2", "c3"]
    assert all(c.fact_id != "c1" for c in result.changes)
