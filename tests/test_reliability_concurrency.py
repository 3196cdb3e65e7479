"""Reliability (issue 6): many extractions of one user at once, and nobody starves.

Fifty threads of one (user, agent), each teaching a distinct fact, extracted by two worker processes
with several threads each: no update is lost, for file and Redis storage. A thread that never goes
quiet is still extracted within max_delay, and one tenant's flood does not hold up another's flush.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
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
        interval=0.2,
        what="all fifty facts",
    )
    wait_for(lambda: queue_idle(queue), what="the queue drained")
    assert sorted(facts_of(settings, "uma", "coder")) == expected  # all there, none twice
    assert openai_server.call_count == threads
    per_worker = [p.log_text().count("outcome=updated") for p in celery_procs.processes[:2]]
    assert sum(per_worker) == threads and min(per_worker) > 0, per_worker  # both took part


def test_a_thread_that_never_goes_quiet_is_extracted_within_max_delay(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    redis_client: Any,
) -> None:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, debounce_seconds=2.0, max_delay_seconds=3.0
    )
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    context_id = ContextKey.create("t-chatty", "cal", None).id
    context = KeySchema(settings.key_prefix, settings.shards).for_context(context_id)
    fields = ("pending_since_ms", "deadline_ms", "last_enqueued_ms")
    stop = threading.Event()
    history: list[dict[str, str]] = []
    seen: list[dict[str, int]] = []  # the stored schedule after each turn

    def chatty() -> None:
        with MemoryProducer(settings) as producer:
            n = 0
            while not stop.is_set():
                history.extend(turn(f"item-{n}"))
                producer.after_agent("t-chatty", "cal", None, list(history))
                values = redis_client.hmget(context.context(context_id), *fields)
                seen.append({f: int(v) for f, v in zip(fields, values, strict=True) if v})
                n += 1
                stop.wait(0.3)  # a new turn every 0.3 s, far inside the 2 s debounce

    def windows() -> list[int]:
        """The pending windows seen so far: a claim ends one, the next turn opens another."""
        return sorted({s["pending_since_ms"] for s in list(seen) if "pending_since_ms" in s})

    talker = threading.Thread(target=chatty, daemon=True)
    talker.start()
    try:
        wait_for(lambda: len(windows()) >= 3, what="two windows claimed")
    finally:
        stop.set()
        talker.join(10)
    assert not talker.is_alive()

    # The schedule, not a stopwatch: the deadline never passes max_delay after the window's
    # first turn however often the thread talks, and the claim that ends a window comes once
    # that capped deadline is due, never earlier.
    max_delay, debounce = settings.max_delay_ms, settings.debounce_ms
    pending = [s for s in seen if "pending_since_ms" in s and "deadline_ms" in s]
    assert all(s["deadline_ms"] <= s["pending_since_ms"] + max_delay for s in pending), pending
    first, second, third = windows()[:3]
    for since, next_since in ((first, second), (second, third)):
        capped = since + max_delay
        # The cap did the scheduling: the debounce alone would have pushed the run later.
        assert any(
            s["pending_since_ms"] == since
            and s["deadline_ms"] == capped
            and s["last_enqueued_ms"] + debounce > capped
            for s in pending
        ), (since, pending)
        assert next_since >= capped, (since, next_since)  # claimed when due, and it ran
    # Each claimed window runs: its model call comes a moment after its claim.
    wait_for(lambda: openai_server.call_count >= 2, what="both claimed windows called the model")


def flood_model(delay_seconds: float) -> tuple[Any, list[str]]:
    """learn_items, slow for the flood; records in order which tenant each call was for."""
    calls: list[str] = []

    def respond(request: dict[str, Any]) -> Reply:
        reply = learn_items(request)
        if "item-9999" in conversation_of(request):
            calls.append("quiet")
        else:
            calls.append("noisy")
            reply.delay_seconds = delay_seconds  # the flood keeps every worker thread busy
        return reply

    return respond, calls


def test_a_flood_of_turns_does_not_hold_up_another_tenants_flush(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    redis_client: Any,
) -> None:
    openai_server.responder, calls = flood_model(0.05)
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
        assert producer.flush("t-vip", "quiet", None, turn("item-9999"))
        wait_for(lambda: "quiet" in calls, what="the other tenant's flush extracted")
    # Order, not time: the flush is due before any of the flood, so it is not queued behind it.
    before = calls.index("quiet")
    assert before < flood // 2, f"{before} of the flood's {flood} extractions went first"
    wait_for(lambda: facts_of(settings, "quiet") == [fact_for("item-9999")])
    wait_for(lambda: queue_idle(queue), interval=0.2, what="the flood drained")
    assert len(facts_of(settings, "noisy")) == flood


def test_a_backlog_of_one_tenants_flushes_does_not_hold_up_another_tenants_flush(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
) -> None:
    openai_server.responder, calls = flood_model(0.1)
    settings: MemqSettings = stack_settings(make_settings, openai_server)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_beat(env)
    backlog = 120

    with MemoryProducer(settings) as producer:
        for n in range(backlog):
            assert producer.flush(f"t{n}", "noisy", None, turn(f"item-{n}"))
        wait_for(lambda: len(calls) >= 8, what="the flood under way")
        assert producer.flush("t-vip", "quiet", None, turn("item-9999"))
        wait_for(lambda: "quiet" in calls, what="the other tenant's flush extracted")
    # Due last, yet extracted while most of the backlog still waits: the per-user cap keeps the
    # noisy tenant from holding every claim, so the next tick takes the quiet tenant's flush.
    before = calls.index("quiet")
    assert before < backlog // 2, f"{before} of the backlog's {backlog} extractions went first"
