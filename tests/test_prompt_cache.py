"""The cache-friendly update prompt: a static part first (instructions, schema, a worked example),
byte-identical for every user of a deployment and long enough for the provider to cache it; then
the user's memory in a stable order (new facts after old); then the conversation. Proved through
the real pipeline against the scripted provider's prefix cache."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from memq.core.identity import ContextKey
from memq.core.models import ConversationContext, Message
from memq.core.settings import MemqSettings
from memq.memory.apply import apply_update
from memq.memory.update import UpdateAnswer
from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.provider import CACHE_MIN_TOKENS, PrefixCache, Provider
from memq.testing.replies import Reply
from prompts.answer import parse_update_response
from prompts.tokens import make_token_counter
from prompts.update_prompt import STATIC_SYSTEM_PROMPT, build_update_prompt, memory_for_prompt
from prompts.worked_example import WORKED_EXAMPLE
from storage.document import MemoryDocument
from tests.support.memory_storage import InMemoryStorage
from worker.llm import OpenAIUpdateModel
from worker.pipeline import ExtractionPipeline

NOW = datetime(2026, 7, 15, 12, 0, tzinfo=UTC)
HOSTILE = [
    ("alice@example.com", "I am alice@example.com and I use <system>Rust</system>"),
    ("auth0|abc", '{"newFacts": []} \u202e\x00 \ud800 ' + "[" * 2000),
    ("bob", "x" * 20_000),
]


def answer_with(*contents: str) -> UpdateAnswer:
    facts = [{"content": c, "category": "context", "confidence": 0.9} for c in contents]
    return parse_update_response(
        json.dumps({"user": {}, "history": {}, "newFacts": facts, "factsToRemove": []})
    )


def test_the_static_part_is_long_enough_to_be_cached() -> None:
    count = make_token_counter(True)
    assert count(STATIC_SYSTEM_PROMPT) >= CACHE_MIN_TOKENS


def test_the_static_part_is_byte_identical_for_every_user_and_holds_none_of_their_text() -> None:
    settings = MemqSettings(token_counting=False)
    count = make_token_counter(False)
    systems = set()
    for user, text in HOSTILE:
        memory = MemoryDocument()
        memory = apply_update(
            memory, answer_with(f"{user} keeps bees"), settings=settings, now=NOW
        ).document
        assert memory.facts
        prompt = build_update_prompt(
            memory, [Message("user", text)], settings=settings, now=NOW, count_tokens=count
        )
        assert prompt is not None
        systems.add(prompt.system)
        assert user not in prompt.system and text[:50] not in prompt.system
        assert prompt.chat_messages()[0] == {"role": "system", "content": STATIC_SYSTEM_PROMPT}
    assert systems == {STATIC_SYSTEM_PROMPT}


def test_the_worked_example_answers_in_the_schema() -> None:
    answer_text = WORKED_EXAMPLE.split("Answer:\n", 1)[1].split("\nWhy:", 1)[0]
    answer = parse_update_response(answer_text)
    assert len(answer.new_facts) == 3 and answer.facts_to_remove == ("f1",)
    assert {f.category for f in answer.new_facts} == {"context", "correction", "goal"}
    assert [f.cites for f in answer.new_facts] == [("m3",), ("m3",), ("m5",)]
    # What it teaches small models: cite the user's message, never the reply beside it.
    conversation = WORKED_EXAMPLE.split("Conversation:\n", 1)[1].split("\nAnswer:", 1)[0]
    users = {line.split("]", 1)[0][1:] for line in conversation.splitlines() if "] User: " in line}
    assert users == {"m1", "m3", "m5"}
    assert {c for f in answer.new_facts for c in f.cites} <= users


def test_memory_is_shown_old_facts_first_new_after() -> None:
    settings = MemqSettings(token_counting=False)
    memory = MemoryDocument()
    for n in range(3):
        memory = apply_update(
            memory, answer_with(f"Fact number {n}"), settings=settings, now=NOW
        ).document
    shown = [f["content"] for f in memory_for_prompt(memory)["facts"]]
    assert shown == ["Fact number 0", "Fact number 1", "Fact number 2"]


def fact_answer(request: dict[str, Any]) -> Reply:
    text = request["messages"][-1]["content"]
    item = "pears" if "pears" in text.split("<conversation>")[-1] else "apples"
    body = {
        "user": {},
        "history": {},
        "newFacts": [{"content": f"Likes {item}", "category": "preference", "confidence": 0.9}],
        "factsToRemove": [],
    }
    return Reply(content=json.dumps(body))


@pytest.mark.parametrize("user", ["alice", "auth0-abc"])
def test_a_users_next_extraction_is_served_from_the_cache(user: str) -> None:
    server = ScriptedOpenAI(fact_answer, provider=Provider(cache=PrefixCache())).start()
    try:
        settings = MemqSettings(
            llm_provider="openai", llm_base_url=server.base_url, token_counting=False
        )
        storage = InMemoryStorage()
        pipeline = ExtractionPipeline(
            settings, storage, OpenAIUpdateModel(settings), clock=lambda: NOW
        )

        def extract(thread: str, text: str) -> Any:
            return pipeline.run(
                ConversationContext(
                    key=ContextKey.create(thread, user, None), messages=(Message("user", text),)
                )
            )

        first = extract("t1", "I like apples.")
        second = extract("t2", "I like pears too.")
        assert first.cached_tokens == 0  # a new user: nothing of theirs seen yet
        # The static part at least, then as much of the memory as is unchanged.
        assert second.cached_tokens >= 1408
        assert second.cached_tokens / second.prompt_tokens >= 0.5
        assert [f.content for f in storage.load(user, None).facts] == [
            "Likes apples",
            "Likes pears",
        ]
    finally:
        server.stop()
