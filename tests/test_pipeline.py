"""The extraction pipeline end to end on one context: the real `openai` client against the scripted
server, an in-memory storage, and what a user would check afterwards — the memory, the report, and
the memory left untouched on every failure."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from memq.core.errors import ResponseParseError, TransientLLMError
from memq.core.identity import ContextKey
from memq.core.models import ConversationContext, Message
from memq.core.settings import MemqSettings
from prompts.update_prompt import CORRECTION_HINT, REINFORCEMENT_HINT
from storage.document import Fact, MemoryDocument
from tests.support.memory_storage import InMemoryStorage
from tests.support.openai_server import EMPTY_UPDATE, Reply, ScriptedOpenAI
from worker.llm import OpenAIUpdateModel
from worker.pipeline import ExtractionPipeline

NOW = datetime(2026, 7, 15, 12, 0, tzinfo=UTC)
USER, AGENT = "alice", "coder"


def update_json(*facts: dict[str, Any], remove: tuple[str, ...] = ()) -> str:
    return json.dumps(
        {
            "user": {"workContext": {"summary": "Backend engineer", "shouldUpdate": True}},
            "history": {},
            "newFacts": list(facts),
            "factsToRemove": list(remove),
        }
    )


RUST = {"content": "Writes Rust at work", "category": "knowledge", "confidence": 0.9}


def context(**kw: Any) -> ConversationContext:
    messages = kw.pop(
        "messages",
        (Message("user", "I write Rust at work."), Message("assistant", "Great, noted.")),
    )
    return ConversationContext(
        key=ContextKey.create("thread-1", USER, AGENT),
        messages=messages,
        trace_id="trace-1",
        **kw,
    )


class Harness:
    def __init__(self, server: ScriptedOpenAI, **overrides: Any) -> None:
        values: dict[str, Any] = {
            "llm_provider": "openai",
            "llm_base_url": server.base_url,
            "llm_timeout_seconds": 5.0,
            "llm_max_retries": 2,
            "token_counting": False,
        }
        values.update(overrides)
        self.settings = MemqSettings(**values)
        self.server = server
        self.storage = InMemoryStorage()
        self.sleeps: list[float] = []
        self.model = OpenAIUpdateModel(self.settings, sleep=self.sleeps.append)
        self.pipeline = ExtractionPipeline(
            self.settings, self.storage, self.model, clock=lambda: NOW
        )

    def memory(self) -> MemoryDocument:
        return self.storage.load(USER, AGENT)


@pytest.fixture
def harness(openai_server: ScriptedOpenAI) -> Harness:
    return Harness(openai_server)


@pytest.mark.parametrize(
    "wrap",
    [
        "ANSWER",
        "<think>The user mentions Rust {maybe}.</think>\nANSWER",
        "```json\nANSWER\n```",
        "Sure! Here is the memory update you asked for:\nANSWER\nLet me know if you need more.",
        '{"user": "alice", "note": "decoy"}\nANSWER',
    ],
)
def test_wrapped_answers_update_the_memory(harness: Harness, wrap: str) -> None:
    harness.server.script(Reply(content=wrap.replace("ANSWER", update_json(RUST))))
    report = harness.pipeline.run(context())
    memory = harness.memory()
    assert [f.content for f in memory.facts] == ["Writes Rust at work"]
    assert memory.facts[0].source_thread_id == "thread-1"
    assert memory.user.work_context.summary == "Backend engineer"
    assert report.outcome == "updated" and report.facts_added == 1


def test_report_carries_usage_and_changes(harness: Harness) -> None:
    harness.server.script(
        Reply(content=update_json(RUST), prompt_tokens=1234, completion_tokens=56)
    )
    report = harness.pipeline.run(context())
    assert (report.prompt_tokens, report.completion_tokens) == (1234, 56)
    assert report.messages_sent == 2 and report.duration_ms >= 0
    assert sorted(c.action for c in report.changes) == ["add", "summary"]
    assert harness.storage.history(USER, AGENT) == report.changes[::-1]  # newest first


def test_garbage_is_a_parse_error_and_the_memory_is_untouched(harness: Harness) -> None:
    before = MemoryDocument(facts=[Fact(id="f1", content="Likes tea")])
    harness.storage.save(USER, AGENT, before)
    saved, saves = harness.memory(), harness.storage.saves
    harness.server.script(Reply(content="I'm sorry, I can't produce JSON today."))
    with pytest.raises(ResponseParseError):
        harness.pipeline.run(context())
    assert harness.storage.saves == saves and harness.memory() == saved


def test_fail_closed_answer_leaves_the_memory_untouched(harness: Harness) -> None:
    harness.storage.save(USER, AGENT, MemoryDocument(facts=[Fact(id="f1", content="Uses npm")]))
    broken = update_json({"content": "", "confidence": 0.9}, remove=("f1",))
    harness.server.script(Reply(content=broken))
    with pytest.raises(ResponseParseError):
        harness.pipeline.run(context())
    assert [f.id for f in harness.memory().facts] == ["f1"]


def test_server_errors_are_retried_and_then_succeed(harness: Harness) -> None:
    harness.server.script(Reply(status=500), Reply(status=500), Reply(content=update_json(RUST)))
    report = harness.pipeline.run(context())
    assert report.outcome == "updated" and harness.server.call_count == 3


def test_persistent_server_errors_raise_transient_and_save_nothing(harness: Harness) -> None:
    harness.server.script(*[Reply(status=500)] * 3)
    with pytest.raises(TransientLLMError):
        harness.pipeline.run(context())
    assert harness.storage.saves == 0 and harness.server.call_count == 3


def test_rate_limit_with_retry_after(harness: Harness) -> None:
    harness.server.script(
        Reply(status=429, headers={"Retry-After": "3"}), Reply(content=update_json(RUST))
    )
    assert harness.pipeline.run(context()).outcome == "updated"
    assert harness.sleeps == [3.0]


def test_timeouts_retried_then_a_typed_error(openai_server: ScriptedOpenAI) -> None:
    harness = Harness(openai_server, llm_timeout_seconds=0.3, llm_max_retries=1)
    openai_server.script(*[Reply(content=update_json(RUST), delay_seconds=1.0)] * 2)
    with pytest.raises(TransientLLMError, match="timed out"):
        harness.pipeline.run(context())
    assert openai_server.call_count == 2 and harness.storage.saves == 0


@pytest.mark.parametrize(
    ("said", "correction", "reinforcement"),
    [
        ("Thanks.", False, False),
        ("That's wrong, I use pnpm.", True, False),
        ("Perfect!", False, True),
        ("Perfect! Wait, that's wrong.", True, False),  # a correction suppresses the praise
    ],
)
def test_signal_hints_follow_what_the_new_messages_say(
    harness: Harness, said: str, correction: bool, reinforcement: bool
) -> None:
    messages = (
        Message("user", "I write Rust at work."),
        Message("assistant", "Noted."),
        Message("user", said),
    )
    harness.pipeline.run(context(messages=messages))
    (prompt,) = harness.server.prompts()
    assert (CORRECTION_HINT in prompt) is correction
    assert (REINFORCEMENT_HINT in prompt) is reinforcement


def test_nothing_to_send_skips_without_calling_the_model(harness: Harness) -> None:
    assert harness.pipeline.run(context(messages=())).outcome == "skipped"
    blank = (Message("user", "  "), Message("assistant", ""))
    assert harness.pipeline.run(context(messages=blank)).reason == "blank conversation"
    assert harness.server.call_count == 0


def test_an_empty_answer_is_unchanged_and_writes_nothing(harness: Harness) -> None:
    harness.server.script(Reply(content=EMPTY_UPDATE))
    assert harness.pipeline.run(context()).outcome == "unchanged"
    assert harness.storage.saves == 0


def test_no_lock_during_the_llm_call_and_the_answer_applies_to_the_latest_document(
    openai_server: ScriptedOpenAI,
) -> None:
    """While the model thinks, another thread's extraction saves; neither write is lost, and a
    removal of a fact that vanished meanwhile is a no-op."""
    harness = Harness(openai_server)
    harness.storage.save(
        USER, AGENT, MemoryDocument(facts=[Fact(id="old", content="Uses Python 2")])
    )
    seen_lock: list[bool] = []

    def responder(request: dict[str, Any]) -> Reply:
        seen_lock.append(harness.storage.lock.locked())
        harness.storage.save(
            USER, AGENT, MemoryDocument(facts=[Fact(id="other", content="Lives in Lyon")])
        )
        upgrade = {"content": "Uses Python 3.12", "category": "knowledge", "confidence": 0.9}
        return Reply(content=update_json(upgrade, remove=("old",)))

    openai_server.responder = responder
    harness.pipeline.run(context())
    assert seen_lock == [False]
    assert [f.content for f in harness.memory().facts] == ["Lives in Lyon", "Uses Python 3.12"]


def test_default_token_counter_is_used_when_none_is_injected(openai_server: ScriptedOpenAI) -> None:
    settings = MemqSettings(llm_provider="openai", llm_base_url=openai_server.base_url)
    storage = InMemoryStorage()
    pipeline = ExtractionPipeline(settings, storage, OpenAIUpdateModel(settings))
    openai_server.script(Reply(content=update_json(RUST)))
    assert pipeline.run(context()).outcome == "updated"


def test_the_report_counts_facts_dropped_as_invalid_and_refused(harness: Harness) -> None:
    """What the worker's log line and metrics carry: new facts that did not validate, and new
    facts refused because only the assistant said them (the model cites the assistant's m2)."""
    echoed = {**RUST, "content": "Has a cat", "cites": ["m2"]}
    invalid = {"content": "   ", "confidence": 0.9}
    harness.server.script(Reply(content=update_json(RUST, echoed, invalid)))
    report = harness.pipeline.run(context())
    assert (report.facts_added, report.facts_invalid, report.facts_refused) == (1, 1, 1)
    (fact,) = harness.memory().facts
    assert fact.content == "Writes Rust at work" and fact.sources[0].attribution == "run"
