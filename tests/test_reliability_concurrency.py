"""Reliability (issue 6): many extractions of one user at once, and nobody starves.

Fifty threads of one (user, agent), each teaching a distinct fact, extracted by two worker processes
with several threads each: no update is lost, for file and Redis storage. A thread that never goes
quiet is still extracted within max_delay, and one tenant's flood does not hold up another's flush.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from core.settings import MemqSettings
from producer import MemoryProducer
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import (
    conversation_of,
    fact_for,
    facts_of,
    learn_items,
    queue_idle,
    stack_settings,
    turn,
)
from tests.support.waiting import wait_for
from worker.queue import QueueClient

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.integration]


def slow_learner(delay_seconds: float) -> Any:
    """learn_items, taking ``delay_seconds`` like a real model (so extractions overlap)."""

    def respond(request: dict[str, Any]) -> Reply:
        reply = learn_items(request)
        reply.delay_seconds = delay_seconds
        return reply

    return respond


@pytest.mark.parametrize("storage", ["file", "redis"])
def test_fifty_threads_of_one_user_lose_no_fact(
    storage: str,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    redis_client: Any,
) -> None:
    openai_server.responder = slow_learner(0.05)
    settings: MemqSettings = stack_settings(make_settings, openai_server, storage=storage)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_beat(env)
    queue = QueueClient(settings, redis_client)
    threads = 50

    with MemoryProducer(settings) as producer:
        for n in range(threads):
            assert producer.flush(f"thread-{n}", "uma", "Coder", turn(f"item-{n}"))

    expected = sorted(fact_for(f"item-{n}") for n in range(threads))
    wait_for(
        lambda: len(facts_of(settings, "uma", "coder")) >= threads,
        timeout=40,
        interval=0.2,
        what="all fifty facts",
    )
    wait_for(lambda: queue_idle(queue), timeout=10, what="the queue drained")
    assert sorted(facts_of(settings, "uma", "coder")) == expected  # all there, none twice
    assert openai_server.call_count == threads
    per_worker = [p.log_text().count("outcome=updated") for p in celery_procs.processes[:2]]
    assert sum(per_worker) == threads and min(per_worker) > 0, per_worker  # both took part


def test_a_thread_that_never_goes_quiet_is_extracted_within_max_delay(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
) -> None:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, debounce_seconds=1.0, max_delay_seconds=3.0
    )
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    stop = threading.Event()
    history: list[dict[str, str]] = []
    first_turn: list[float] = []

    def chatty() -> None:
        with MemoryProducer(settings) as producer:
            n = 0
            while not stop.is_set():
                history.extend(turn(f"item-{n}"))
                producer.after_agent("t-chatty", "cal", None, list(history))
                first_turn.append(time.monotonic())
                n += 1
                stop.wait(0.3)  # a new turn every 0.3 s, far inside the 1 s debounce

    talker = threading.Thread(target=chatty, daemon=True)
    talker.start()
    try:
        wait_for(lambda: openai_server.call_count >= 2, timeout=15, what="two extractions")
        calls = list(openai_server.request_times[:2])
    finally:
        stop.set()
        talker.join(10)
    slack = 1.5  # ticks, the LLM round trip and a loaded 2-core machine
    assert calls[0] - first_turn[0] < settings.max_delay_seconds + slack
    # The next window starts with the first turn after the claim: the cap holds again.
    assert calls[1] - calls[0] < settings.max_delay_seconds + slack
    assert not talker.is_alive()


def flood_model(delay_seconds: float) -> tuple[Any, list[float]]:
    """learn_items, slow for the flood, recording when the other tenant's call arrives."""
    vip_calls: list[float] = []

    def respond(request: dict[str, Any]) -> Reply:
        reply = learn_items(request)
        if "item-9999" in conversation_of(request):
            vip_calls.append(time.monotonic())
        else:
            reply.delay_seconds = delay_seconds  # the flood keeps every worker thread busy
        return reply

    return respond, vip_calls


def test_a_flood_of_turns_does_not_hold_up_another_tenants_flush(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    redis_client: Any,
) -> None:
    openai_server.responder, vip_calls = flood_model(0.05)
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, debounce_seconds=2.0, max_delay_seconds=4.0
    )
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_beat(env)
    queue = QueueClient(settings, redis_client)
    flood = 150  # under max_facts (200), so every one of them is kept

    with MemoryProducer(settings) as producer:
        for n in range(flood):  # tenant "noisy": hundreds of threads talking at once
            assert producer.after_agent(f"t{n}", "noisy", None, turn(f"item-{n}"))
        started = time.monotonic()
        assert producer.flush("t-vip", "quiet", None, turn("item-9999"))
        wait_for(lambda: vip_calls, timeout=30, what="the other tenant's flush extracted")
    waited = vip_calls[0] - started
    assert waited < 5 * settings.tick_seconds + 1.0, waited  # a few ticks, not the flood's time
    wait_for(lambda: facts_of(settings, "quiet") == [fact_for("item-9999")], timeout=5)
    wait_for(lambda: queue_idle(queue), timeout=40, interval=0.2, what="the flood drained")
    assert len(facts_of(settings, "noisy")) == flood


def test_a_backlog_of_one_tenants_flushes_does_not_hold_up_another_tenants_flush(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
) -> None:
    openai_server.responder, vip_calls = flood_model(0.05)
    settings: MemqSettings = stack_settings(make_settings, openai_server)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_beat(env)

    with MemoryProducer(settings) as producer:
        for n in range(120):
            assert producer.flush(f"t{n}", "noisy", None, turn(f"item-{n}"))
        wait_for(lambda: openai_server.call_count >= 8, timeout=10, what="the flood under way")
        started = time.monotonic()
        assert producer.flush("t-vip", "quiet", None, turn("item-9999"))
        wait_for(lambda: vip_calls, timeout=30, what="the other tenant's flush extracted")
    assert vip_calls[0] - started < 5 * settings.tick_seconds + 1.0
