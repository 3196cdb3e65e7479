"""End to end: the producer enqueues, a real `celery beat` ticks, a real `celery worker` (threads
pool) extracts with the real `openai` client against the scripted OpenAI-compatible server on
loopback, and the memory document ends up holding what the model answered."""

from __future__ import annotations

import time
from typing import Any

import pytest

from memq.core.settings import MemqSettings
from producer.enqueue import EnqueueCode
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import (
    fact_for,
    facts_of,
    learn_items,
    queue_idle,
    stack_settings,
    turn,
)
from tests.support.waiting import wait_for
from worker.queue import QueueClient

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_three_quick_turns_make_exactly_one_llm_call(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(make_settings, openai_server, debounce_seconds=1.0)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2, pool="threads")
    producer = producer_for(settings)
    queue = QueueClient(settings, redis_client)

    # The ticker starts after the turns, so however slow this machine is they share one window:
    # the test is about what one window of three turns becomes, not about how fast they came.
    history: list[dict[str, str]] = []
    results = []
    for number in (1, 2, 3):
        history += turn(f"item-{number}", "I study octopuses at the Lisbon aquarium.")
        results.append(producer.enqueue("thread-1", "alice", None, list(history)))
    assert [(r.version, r.code) for r in results] == [(n, EnqueueCode.SCHEDULED) for n in (1, 2, 3)]
    deadlines = [r.deadline_ms for r in results]
    assert deadlines == sorted(deadlines)  # each turn pushed the one pending run back
    celery_procs.start_beat(env)

    expected = [fact_for(f"item-{n}") for n in (1, 2, 3)]
    wait_for(lambda: sorted(facts_of(settings, "alice")) == expected, what="the facts stored")
    wait_for(lambda: queue_idle(queue), what="the queue drained")
    assert openai_server.call_count == 1, celery_procs.logs()
    assert "item-3" in openai_server.prompts()[0]  # the latest messages, not the first turn's
    assert queue.stats()["completed_total"] == 1
    logs = celery_procs.logs()
    assert "memq.extract" in logs and "outcome=updated" in logs
    assert "octopuses" not in logs and "sk-scripted" not in logs  # no content, no secrets


def test_a_flush_is_due_at_once_and_extracted_without_waiting_out_the_debounce(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    openai_server.responder = learn_items
    # A debounce far longer than the wait below: only the flush can make it in time.
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, debounce_seconds=120.0, max_delay_seconds=240.0
    )
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2, pool="threads")
    celery_procs.start_beat(env)
    producer = producer_for(settings)

    result = producer.enqueue("thread-9", "bob", None, turn("item-1"), flush=True)
    assert result is not None and result.code == EnqueueCode.SCHEDULED
    assert result.deadline_ms <= time.time_ns() // 1_000_000  # due already, not in 120 s

    wait_for(
        lambda: facts_of(settings, "bob") == [fact_for("item-1")],
        what="the flushed fact",
    )
    assert openai_server.call_count == 1
    wait_for(lambda: queue_idle(QueueClient(settings, redis_client)))
