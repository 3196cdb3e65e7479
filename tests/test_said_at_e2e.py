"""Facts that know when, end to end: a real `memq serve` (uvicorn), a real Redis, a real Celery
worker and beat, the real `openai` client against a scripted model that cites and resolves
"last Saturday" as the prompt asks. A message's timestamp reaches the fact's said-at (apart from
when memq learnt it), the block states that day, time windows filter the block and search, and
hostile timestamps never break a hand-off."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage

from memq.core.settings import MemqSettings
from memq.testing.openai_server import CitingModel, Teach
from memq.testing.waiting import wait_for
from producer.injector import MemoryInjector
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import document_of, stack_settings
from tests.support.serve import Keys, bearer

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

RACE = Teach("User ran a charity race", said="charity race", role="user")
TEA = Teach("User drinks green tea", said="green tea", role="user")
SAID = "2023-05-08T13:56:00Z"  # a Monday: "last Saturday" is 2023-05-06


@pytest.fixture
def stack(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs
) -> MemqSettings:
    openai_server.responder = CitingModel([RACE, TEA])
    settings: MemqSettings = stack_settings(make_settings, openai_server, storage="redis")
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2, pool="threads")
    celery_procs.start_beat(env)
    return settings


def test_a_timestamp_sent_over_http_reaches_the_fact_and_the_block(
    stack: MemqSettings, serve_for: Any
) -> None:
    server = serve_for(stack)
    started = datetime.now(UTC)
    with httpx.Client(base_url=server.url, timeout=30, headers=bearer(Keys().agent)) as http:
        body = {
            "thread_id": "chat-1",
            "flush": True,
            "messages": [
                {
                    "role": "user",
                    "content": "I ran a charity race last Saturday",
                    "created_at": SAID,
                },
                # A hostile time on the reply: dropped to the hand-off time, never a refusal.
                {"role": "assistant", "content": "Well done!", "created_at": "9" * 50_000},
            ],
        }
        answer = http.post("/v1/users/app1-carol/conversations", json=body)
        assert answer.status_code == 202, answer.text

        def race() -> dict[str, Any] | None:
            facts = http.get("/v1/users/app1-carol/memory").json()["facts"]
            return next((f for f in facts if f["content"] == RACE.content), None)

        wait_for(lambda: race() is not None, what="the fact over HTTP")
        fact = race()
        assert fact is not None
        assert datetime.fromisoformat(fact["said_at"]) == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
        assert datetime.fromisoformat(fact["created_at"]) >= started  # learnt now, said then
        assert fact["event_date"] == "2023-05-06"
        assert [s["said_at"] for s in fact["sources"]] == [fact["said_at"]]

        def block(**window: str) -> str:
            sent = {"query": "when was the charity race?", **window}
            reply = http.post("/v1/users/app1-carol/context", json=sent)
            assert reply.status_code == 200, reply.text
            return str(reply.json()["block"])

        assert (
            "8 May 2023:\n- [context | 0.95 | event 2023-05-06] User ran a charity race" in block()
        )
        assert RACE.content in block(since="2023-05-01T00:00:00Z", until="2023-05-31T00:00:00Z")
        assert block(since="2024-01-01T00:00:00Z") == ""

        def searched(**window: str) -> list[str]:
            sent = {"query": "charity race", **window}
            reply = http.post("/v1/users/app1-carol/facts/search", json=sent)
            assert reply.status_code == 200, reply.text
            return [f["content"] for f in reply.json()["facts"]]

        assert searched(until="2023-06-01T00:00:00+02:00") == [RACE.content]
        assert searched(until="2023-05-01T00:00:00Z") == []
        naive = http.post("/v1/users/app1-carol/context", json={"since": "2023-05-01T00:00:00"})
        assert naive.status_code == 422  # a window bound without a zone is refused, not guessed


def test_langchain_messages_and_hostile_times_through_the_python_producer(
    stack: MemqSettings, producer_for: Any
) -> None:
    producer = producer_for(stack)
    messages = [
        HumanMessage("I drink green tea every morning", additional_kwargs={"created_at": SAID}),
        AIMessage("Lovely.", response_metadata={"timestamp": math.nan}),
        {"role": "user", "content": "hello again", "created_at": "99999-01-01T00:00:00Z"},
        {"role": "assistant", "content": "Hi!", "timestamp": [1, 2, 3]},
    ]
    assert producer.flush("t-tea", "dave", None, messages) is True
    assert producer.stats.times_dropped == 3 and producer.stats.errors == 0
    wait_for(
        lambda: any(f.content == TEA.content for f in document_of(stack, "dave").facts),
        what="the tea fact",
    )
    (tea,) = [f for f in document_of(stack, "dave").facts if f.content == TEA.content]
    assert tea.said_at == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert tea.event_date is None  # nothing relative to resolve
    injector = MemoryInjector(stack)
    try:
        assert "8 May 2023:\n- [context | 0.95] User drinks green tea" in injector.block("dave")
    finally:
        injector.close()
