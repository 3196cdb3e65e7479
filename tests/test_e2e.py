"""End to end: the producer enqueues, a real `celery beat` ticks, a real `celery worker` (threads
pool) extracts with the real `openai` client against the scripted OpenAI-compatible server on
loopback, and the memory document ends up holding what the model answered."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from core.settings import MemqSettings
from producer import MemoryProducer
from storage import get_storage
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import stack_settings as scenario_settings
from tests.support.waiting import wait_for
from worker.queue import QueueClient

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

FACT = "The user is a marine biologist based in Lisbon"


def update_answer(fact: str) -> str:
    return json.dumps(
        {
            "user": {},
            "history": {},
            "newFacts": [{"content": fact, "category": "context", "confidence": 0.95}],
            "factsToRemove": [],
        }
    )


def turn(number: int) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Turn {number}: I study octopuses at the Lisbon aquarium."},
        {"role": "assistant", "content": f"Noted for turn {number}, that sounds fascinating."},
    ]


def stack_settings(make_settings: Any, server: ScriptedOpenAI, **overrides: Any) -> MemqSettings:
    """The shared stack settings, with a debounce window for the turns to land in."""
    return scenario_settings(make_settings, server, **{"debounce_seconds": 1.0, **overrides})


@pytest.fixture
def producer_for() -> Iterator[Any]:
    made: list[MemoryProducer] = []

    def build(settings: MemqSettings) -> MemoryProducer:
        made.append(MemoryProducer(settings))
        return made[-1]

    yield build
    for producer in made:
        producer.close()


def facts_of(settings: MemqSettings, user: str) -> list[str]:
    return [fact.content for fact in get_storage(settings).load(user, None).facts]


def queue_idle(queue: QueueClient) -> bool:
    stats = queue.stats()
    return stats["due"] == 0 and stats["inflight"] == 0


def test_three_quick_turns_make_exactly_one_llm_call(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    openai_server.responder = lambda request: Reply(content=update_answer(FACT))
    settings = stack_settings(make_settings, openai_server)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2, pool="threads")
    celery_procs.start_beat(env)
    producer = producer_for(settings)
    queue = QueueClient(settings, redis_client)

    started = time.monotonic()
    history: list[dict[str, str]] = []
    for number in (1, 2, 3):
        history += turn(number)
        assert producer.after_agent("thread-1", "alice", None, list(history))
    assert time.monotonic() - started < settings.debounce_seconds  # all within one window

    wait_for(lambda: FACT in facts_of(settings, "alice"), timeout=15, what="the fact stored")
    wait_for(lambda: queue_idle(queue), timeout=5, what="the queue drained")
    assert openai_server.call_count == 1, celery_procs.logs()
    assert "Turn 3" in openai_server.prompts()[0]  # the latest messages, not the first turn's
    assert queue.stats()["metrics"]["extractions"] == 1
    logs = celery_procs.logs()
    assert "memq.extract" in logs and "outcome=updated" in logs
    assert "octopuses" not in logs and "sk-scripted" not in logs  # no content, no secrets


def test_a_flush_is_processed_within_about_one_tick(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    openai_server.responder = lambda request: Reply(content=update_answer(FACT))
    # A debounce far longer than the wait below: only the flush can make it in time.
    settings = stack_settings(
        make_settings, openai_server, debounce_seconds=60.0, max_delay_seconds=120.0
    )
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2, pool="threads")
    celery_procs.start_beat(env)
    producer = producer_for(settings)

    assert producer.flush("thread-9", "bob", None, turn(1))

    # One tick (0.2 s) plus slack for a loaded 2-core machine and the LLM round trip.
    wait_for(lambda: FACT in facts_of(settings, "bob"), timeout=4.0, what="the flushed fact")
    assert openai_server.call_count == 1
    wait_for(lambda: queue_idle(QueueClient(settings, redis_client)), timeout=5)
