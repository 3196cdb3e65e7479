"""Provenance rules on documents: attribution, grounding, confirmations, supersession, forgetting a
thread, `why`, and documents written before provenance existed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memq.core.models import Message
from memq.core.settings import MemqSettings
from memq.memory.apply import apply_update
from memq.memory.deerflow_format import deerflow_document
from memq.memory.update import NewFact, StaleRemoval, UpdateAnswer
from prompts.conversation import message_excerpt
from storage import get_storage
from storage.base import Change
from storage.document import Fact, MemoryDocument
from storage.history import dump_document, parse_document
from storage.management import MemoryManager
from storage.provenance import (
    RunInfo,
    RunMessage,
    explain,
    forget_thread,
    history_without_thread,
    section_threads,
)
from storage.sections import Section, UserContext
from storage.sources import MAX_EXCERPT_CHARS, MAX_SOURCE_EXCERPTS, MAX_SOURCE_MESSAGES, Source
from worker.watermark import message_identity

NOW = datetime(2026, 7, 15, 12, 0, tzinfo=UTC)
SETTINGS = MemqSettings(llm_provider="rules")


def run_of(thread: str, *roles: str, run_id: str = "r1", confirmed: bool = False) -> RunInfo:
    messages = tuple(
        RunMessage(f"m{i}", message_identity(Message(role, f"{thread} {i}")), role)  # type: ignore[arg-type]
        for i, role in enumerate(roles, start=1)
    )
    return RunInfo(thread, run_id, NOW, messages, "gpt-x", "update-test", confirmed)


def learn(
    doc: MemoryDocument, run: RunInfo, *facts: NewFact, settings: MemqSettings = SETTINGS, **kw: Any
) -> Any:
    answer = UpdateAnswer(new_facts=facts, **kw)
    return apply_update(doc, answer, settings=settings, now=NOW, thread_id=run.thread_id, run=run)


def new(content: str, *cites: str) -> NewFact:
    return NewFact(content=content, confidence=0.9, cites=cites)


@pytest.mark.parametrize(
    ("cites", "attribution", "labels"),
    [
        (("m2",), "message", ["m2"]),
        (("m1", "m2"), "message", ["m1", "m2"]),
        ((), "run", ["m1", "m2", "m3"]),
        (("m9",), "run", ["m1", "m2", "m3"]),  # a label the prompt never had
        (("m1", "m9"), "run", ["m1", "m2", "m3"]),  # partly wrong: never trusted in part
        (("M1",), "run", ["m1", "m2", "m3"]),
    ],
)
def test_citations_or_the_whole_run(
    cites: tuple[str, ...], attribution: str, labels: list[str]
) -> None:
    run = run_of("t1", "user", "user", "assistant")
    (fact,) = learn(MemoryDocument(), run, new("Likes tea", *cites)).document.facts
    (source,) = fact.sources
    by_label = {m.label: m.digest for m in run.messages}
    assert source.attribution == attribution
    assert list(source.messages) == [by_label[label] for label in labels]
    assert (source.thread_id, source.run_id, source.model) == ("t1", "r1", "gpt-x")


def test_hostile_citations_are_read_safely() -> None:
    raw = {"content": "x", "cites": ["m1", 3, None, "\u202e\x00m2", "m1", *["m1"] * 10_000]}
    assert NewFact.model_validate(raw).cites == ("m1", "\u202e\x00m2")
    assert NewFact.model_validate({"content": "x", "cites": "m1"}).cites == ("m1",)
    assert NewFact.model_validate({"content": "x", "cites": {"deep": [[["m1"]]]}}).cites == ()


def test_assistant_only_facts_need_the_users_word() -> None:
    run = run_of("t1", "user", "assistant")
    refused = learn(MemoryDocument(), run, new("Has a cat", "m2"))
    assert refused.document.facts == [] and refused.refused == 1
    confirmed = learn(
        MemoryDocument(), run_of("t1", "user", "assistant", confirmed=True), new("Has a cat", "m2")
    )
    assert [f.content for f in confirmed.document.facts] == ["Has a cat"]
    cited_by_user = learn(MemoryDocument(), run, new("Has a cat", "m1", "m2"))
    assert len(cited_by_user.document.facts) == 1
    off = SETTINGS.model_copy(update={"grounding_requires_user": False})
    assert (
        len(learn(MemoryDocument(), run, new("Has a cat", "m2"), settings=off).document.facts) == 1
    )
    only_assistant = run_of("t1", "assistant")
    assert learn(MemoryDocument(), only_assistant, new("Has a cat")).refused == 1  # run-level too


def test_learning_again_confirms_once_per_new_run_and_is_bounded() -> None:
    doc = learn(MemoryDocument(), run_of("t1", "user"), new("Likes tea", "m1")).document
    same_run = learn(doc, run_of("t1", "user"), new("likes  TEA", "m1"))
    assert same_run.changes == [] and same_run.document.facts[0].confirmations == 0
    retried = learn(doc, run_of("t1", "user", run_id="r2"), new("Likes tea", "m1"))
    assert retried.document.facts[0].confirmations == 0  # the same message again: a re-run
    settings = SETTINGS.model_copy(update={"fact_max_sources": 3})
    for n in range(2, 7):
        result = learn(
            doc, run_of(f"t{n}", "user", run_id=f"r{n}"), new("Likes tea"), settings=settings
        )
        doc = result.document
        assert [c.action for c in result.changes] == ["confirm"]
    (fact,) = doc.facts
    assert fact.confirmations == 5
    assert [s.thread_id for s in fact.sources] == ["t4", "t5", "t6"]


def test_contradicted_and_stale_facts_are_superseded_bounded_and_never_shown() -> None:
    old = NOW - timedelta(days=400)
    doc = MemoryDocument(
        facts=[
            Fact(id="munich", content="Lives in Munich", source_thread_id="t0", created_at=old),
            *(Fact(id=f"s{i}", content=f"stale {i}", created_at=old) for i in range(3)),
        ]
    )
    settings = SETTINGS.model_copy(update={"superseded_max_facts": 2})
    result = learn(
        doc,
        run_of("t1", "user"),
        new("Lives in Berlin", "m1"),
        facts_to_remove=("munich",),
        stale_facts_to_remove=(StaleRemoval(id="s0", reason="moved on"), StaleRemoval(id="s1")),
        settings=settings,
    )
    berlin = next(f for f in result.document.facts if f.content == "Lives in Berlin")
    kinds = [(e.fact.id, e.kind) for e in result.document.superseded]
    assert kinds == [("s0", "stale"), ("s1", "stale")]  # bounded: the oldest entry went first
    unbounded = learn(
        doc, run_of("t1", "user"), new("Lives in Berlin", "m1"), facts_to_remove=("munich",)
    ).document
    (munich,) = unbounded.superseded
    assert munich.replaced_by == [
        next(f.id for f in unbounded.facts if f.content == "Lives in Berlin")
    ]
    assert munich.thread_id == "t1" and munich.superseded_at == NOW
    assert "munich" not in {f.id for f in unbounded.facts}
    assert berlin.sources[0].attribution == "message"
    from prompts.injection import format_memory_for_injection
    from prompts.update_prompt import memory_for_prompt

    assert "Munich" not in format_memory_for_injection(unbounded)
    assert "Munich" not in json.dumps(memory_for_prompt(unbounded))


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.integration)])
def manager(request: pytest.FixtureRequest, make_settings: Any) -> MemoryManager:
    return MemoryManager(get_storage(make_settings(storage=request.param)))


def test_manual_deletes_stay_deletes(manager: MemoryManager) -> None:
    fact = manager.add_fact("alice", "Likes tea")
    manager.delete_fact("alice", fact.id)
    assert manager.superseded("alice") == []
    assert manager.document("alice").facts == []
    assert manager.why("alice", fact.id).status == "gone"


def test_documents_written_before_provenance_load_unchanged(tmp_path: Any) -> None:
    old = {
        "version": "memq/1",
        "facts": [
            {
                "id": "fact_1",
                "content": "Likes tea",
                "category": "preference",
                "confidence": 0.9,
                "created_at": "2026-01-01T00:00:00Z",
                "source": "conversation",
                "source_thread_id": "auth0|abc:thread/1",
            },
            {"id": "fact_2", "content": "Typed by hand", "source": "manual"},
            {"id": "fact_3", "content": "From DeerFlow", "source": "thread-9"},
        ],
    }
    doc = parse_document(json.dumps(old))
    tea, manual, deerflow = doc.facts
    assert (tea.content, tea.category, tea.confidence) == ("Likes tea", "preference", 0.9)
    assert tea.provenance() == [Source(thread_id="auth0|abc:thread/1")]  # run-level, its thread
    assert tea.provenance()[0].attribution == "run" and tea.sources == []
    assert manual.provenance() == [] and deerflow.provenance()[0].thread_id == "thread-9"
    assert parse_document(dump_document(doc)) == doc
    assert doc.superseded == []


def test_unreadable_provenance_never_costs_the_fact() -> None:
    fact = Fact.model_validate(
        {
            "content": "x",
            "sources": [{"thread_id": "t", "messages": ["a"] * 100, "roles": "user"}, "junk", 7],
            "confirmations": -3,
        }
    )
    (source,) = fact.sources
    assert len(source.messages) == MAX_SOURCE_MESSAGES and source.roles == ()
    assert fact.confirmations == 0
    doc = MemoryDocument.model_validate({"facts": [], "superseded": [{"fact": {}}, "x", None]})
    assert doc.superseded == []


def test_deerflow_export_keeps_the_thread_it_can_hold() -> None:
    run = run_of("t1", "user")
    doc = learn(MemoryDocument(), run, new("Likes tea", "m1")).document
    doc = learn(doc, run_of("t2", "user", run_id="r2"), new("Likes tea", "m1")).document
    exported = deerflow_document(doc)
    (fact,) = exported["facts"]
    assert fact["source"] == "t1" and "superseded" not in exported
    back = MemoryDocument.model_validate(exported)
    assert back.facts[0].provenance() == [Source(thread_id="t1")]


def test_forgetting_a_thread_in_a_document() -> None:
    doc = learn(
        MemoryDocument(), run_of("T", "user"), new("Only in T", "m1"), new("Shared", "m1")
    ).document
    doc = learn(
        doc, run_of("S", "user", run_id="r2"), new("Shared", "m1"), new("Only in S")
    ).document
    doc.facts.append(Fact(content="By hand", source="manual"))
    doc.facts.append(Fact(content="Legacy from T", source_thread_id="T"))
    doc.user = UserContext(work_context=Section(summary="Works on Bluebird (said in T)"))
    history = [Change(action="summary", section="work_context", source_thread_id="T")]
    forgot, result = forget_thread(doc, "T", section_threads=section_threads(history))
    assert sorted(f.content for f in forgot.facts) == ["By hand", "Only in S", "Shared"]
    shared = next(f for f in forgot.facts if f.content == "Shared")
    assert [s.thread_id for s in shared.sources] == ["S"] and shared.confirmations == 0
    assert shared.source_thread_id == "S"
    assert result.trimmed == 1 and len(result.removed) == 2
    assert forgot.user.work_context.summary == "" and result.sections_cleared == ["work_context"]
    again, nothing = forget_thread(forgot, "T", section_threads={})
    assert again == forgot and not nothing.changed
    kept = history_without_thread(
        [
            Change(action="add", fact_id=result.removed[0], content="Only in T"),
            Change(action="add", fact_id=shared.id, source_thread_id="T", content="Shared"),
            Change(action="confirm", fact_id=shared.id, source_thread_id="S", content="Shared"),
        ],
        "T",
        result.removed,
    )
    assert [c.action for c in kept] == ["confirm"]


def test_why_explains_a_current_a_superseded_and_an_unknown_fact() -> None:
    doc = MemoryDocument(
        facts=[Fact(id="munich", content="Lives in Munich", source_thread_id="t0")]
    )
    result = learn(
        doc, run_of("t1", "user"), new("Lives in Berlin", "m1"), facts_to_remove=("munich",)
    )
    berlin = result.document.facts[0]
    history = result.changes
    why_berlin = explain(result.document, history, berlin.id)
    assert why_berlin is not None and why_berlin.status == "current"
    assert [e.fact.id for e in why_berlin.supersedes] == ["munich"]
    assert [c.action for c in why_berlin.history] == ["supersede", "add"]
    why_munich = explain(result.document, history, "munich")
    assert why_munich is not None and why_munich.status == "superseded"
    assert why_munich.sources == [Source(thread_id="t0")]
    assert json.loads(json.dumps(why_munich.to_json()))["superseded"]["replaced_by"] == [berlin.id]
    assert explain(result.document, history, "nope") is None


def test_rewrite_replaces_a_document_and_its_whole_history(manager: MemoryManager) -> None:
    storage = manager.storage
    assert storage.rewrite("eve", None, lambda d, h: (d, h)) is False  # nothing stored
    manager.add_fact("eve", "keep me")
    secret = manager.add_fact("eve", "forget me")
    seen: list[list[str]] = []

    def drop_secret(
        document: MemoryDocument, history: list[Change]
    ) -> tuple[MemoryDocument, list[Change]]:
        seen.append([c.content or "" for c in history])
        document.facts = [f for f in document.facts if f.id != secret.id]
        return document, [c for c in history if c.fact_id != secret.id]

    assert storage.rewrite("eve", None, drop_secret) is True
    assert seen == [["keep me", "forget me"]]  # oldest first
    assert [f.content for f in manager.list_facts("eve")] == ["keep me"]
    assert [c.content for c in manager.history("eve")] == ["keep me"]
    assert storage.rewrite("eve", None, lambda d, h: None) is False


def test_a_message_level_source_keeps_a_bounded_excerpt_of_each_cited_message() -> None:
    said = [
        Message("user", "I moved to Berlin\n\nlast month.\x00\u200b"),
        Message("user", "<script>alert(1)</script> " + "long " * 400),
        Message("assistant", "Noted \ud800 [m1] \u202eevil"),
    ]
    run = RunInfo(
        "t1",
        "r1",
        NOW,
        tuple(
            RunMessage(f"m{i}", message_identity(m), m.role, message_excerpt(m))
            for i, m in enumerate(said, start=1)
        ),
    )
    (cited, whole) = learn(
        MemoryDocument(), run, new("Lives in Berlin", "m1", "m2", "m3"), new("Writes long")
    ).document.facts
    (source,) = cited.sources
    first, second, third = source.excerpts
    assert first == "I moved to Berlin last month."  # one line, control and format chars gone
    assert second.startswith("<script>alert(1)</script> long") and second.endswith("…")
    assert len(second) == MAX_EXCERPT_CHARS
    assert third == "Noted [m1] evil"  # a lone surrogate and a direction override dropped
    assert whole.sources[0].attribution == "run" and whole.sources[0].excerpts == ()
    # Stored and read back as written: an excerpt is a stored string like any other.
    reread = parse_document(dump_document(MemoryDocument(facts=[cited])))
    assert reread.facts[0].sources[0].excerpts == source.excerpts


def test_excerpts_read_from_a_hand_edited_document_are_bounded() -> None:
    fact = Fact.model_validate(
        {
            "content": "x",
            "sources": [
                {"attribution": "message", "messages": ["a"], "excerpts": ["y" * 5000, 3] * 50},
                {"attribution": "run", "messages": ["a"], "excerpts": ["leaked"]},
                {"attribution": "message", "excerpts": "not a list"},
            ],
        }
    )
    kept, run_level, odd = fact.sources
    assert [len(e) for e in kept.excerpts] == [MAX_EXCERPT_CHARS] * MAX_SOURCE_EXCERPTS
    assert run_level.excerpts == () and odd.excerpts == ()


def test_a_run_without_excerpts_cites_without_them() -> None:
    (fact,) = learn(MemoryDocument(), run_of("t1", "user"), new("Likes tea", "m1")).document.facts
    assert fact.sources[0].attribution == "message" and fact.sources[0].excerpts == ()
