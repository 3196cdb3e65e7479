"""Reliability (issue 10, item 5): a summarised history never drops what was handed over and not
yet extracted.

An agent that summarises flushes the old messages, then hands over a short history (a summary plus
the new turn). Whenever that second hand-off reaches the queue before the flushed messages were
extracted — at once, while the context waits behind the per-user cap, while it is in flight, or in
the producer's spool during a Redis outage — both turns must reach the model, once each. Real
Celery worker and beat, real Redis, the real openai client against the scripted server, which
"learns" every ``item-<n>`` of the conversation slot.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import (
    ITEM,
    conversation_of,
    fact_for,
    facts_of,
    learn_items,
    queue_idle,
    stack_settings,
    turn,
)
from tests.support.waiting import wait_for
from worker.celery_app import TICK_TASK, create_app
from worker.queue import QueueClient

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.integration]

SUMMARY = {"role": "user", "content": "Summary of the conversation so far: we talked about pets."}


def summarised(item: str) -> list[dict[str, str]]:
    """What an agent hands over after summarising: the summary, then its next turn."""
    return [SUMMARY, {"role": "assistant", "content": "Thanks."}, *turn(item)]


def items_sent(server: ScriptedOpenAI) -> Counter[str]:
    """How many LLM calls saw each item in their conversation slot."""
    seen: Counter[str] = Counter()
    for request in list(server.requests):
        seen.update(set(ITEM.findall(conversation_of(request))))
    return seen


def slow_learner(delay_seconds: float) -> Any:
    def respond(request: dict[str, Any]) -> Reply:
        reply = learn_items(request)
        reply.delay_seconds = delay_seconds
        return reply

    return respond


def settle(settings: MemqSettings, queue: QueueClient, user: str, items: list[str]) -> None:
    expected = sorted(fact_for(item) for item in items)
    wait_for(
        lambda: sorted(set(facts_of(settings, user))) == expected,
        interval=0.1,
        what=f"facts of {items}",
    )
    wait_for(lambda: queue_idle(queue), what="the queue drained")


def test_flush_then_an_immediate_summarised_turn_extracts_both(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(make_settings, openai_server)
    producer = producer_for(settings)
    # Both hand-offs land before any tick can claim the flush: the beat starts after them.
    assert producer.flush("t1", "ann", None, turn("item-1"))
    assert producer.after_agent("t1", "ann", None, summarised("item-2"))
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    settle(settings, QueueClient(settings, redis_client), "ann", ["item-1", "item-2"])
    assert items_sent(openai_server) == {"item-1": 1, "item-2": 1}
    assert openai_server.call_count == 1, celery_procs.logs()


@pytest.mark.parametrize("where", ["claimed, not started", "in flight", "behind the user cap"])
def test_a_summarised_turn_while_the_context_waits_extracts_every_turn_once(
    where: str,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    openai_server.responder = slow_learner(1.5)
    settings: MemqSettings = stack_settings(make_settings, openai_server, max_inflight_per_user=1)
    env = memq_env(settings)
    if where != "claimed, not started":
        celery_procs.start_worker(env, concurrency=2)
        celery_procs.start_beat(env)
    queue = QueueClient(settings, redis_client)
    producer = producer_for(settings)
    items = ["item-1", "item-2"]
    if where == "behind the user cap":
        # Another thread of the same user holds the only slot while t1's flush waits in `due`.
        assert producer.flush("busy", "bob", None, turn("item-0"))
        wait_for(lambda: openai_server.call_count == 1, what="the busy run")
        items.insert(0, "item-0")
    assert producer.flush("t1", "bob", None, turn("item-1"))
    if where == "in flight":
        wait_for(lambda: openai_server.call_count == 1, what="t1 in flight")
    elif where == "behind the user cap":
        wait_for(lambda: queue.stats()["due"] == 1, what="t1 waiting in due")
    else:  # one tick claims it and sends its task, which waits in the broker for a worker
        app = create_app(settings)
        try:
            app.tasks[TICK_TASK]()
        finally:
            app.close()
        assert queue.stats()["inflight"] == 1
    assert producer.after_agent("t1", "bob", None, summarised("item-2"))
    if where == "claimed, not started":
        celery_procs.start_worker(env, concurrency=2)
        celery_procs.start_beat(env)
    settle(settings, queue, "bob", items)
    assert items_sent(openai_server) == dict.fromkeys(items, 1)


def test_a_spooled_turn_replaced_by_a_summarised_one_extracts_both(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    aof_redis: RedisServer,
    tmp_path: Path,
) -> None:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, redis_url=aof_redis.url, producer_timeout_seconds=0.2
    )
    producer = producer_for(settings)
    aof_redis.stop()  # the outage: both hand-offs go to the producer's spool
    assert not producer.flush("t1", "cyd", None, turn("item-1"))
    assert not producer.after_agent("t1", "cyd", None, summarised("item-2"))
    assert producer.spool_size == 1  # coalesced into one request of t1

    back = RedisServer(aof_redis.data_dir, port=aof_redis.port, appendonly=True).start()
    try:
        wait_for(lambda: producer.stats.replayed == 1, what="the spool replayed")
        env = memq_env(settings)
        celery_procs.start_worker(env, concurrency=2)
        celery_procs.start_beat(env)
        client = redis.Redis.from_url(aof_redis.url, decode_responses=True)
        try:
            settle(settings, QueueClient(settings, client), "cyd", ["item-1", "item-2"])
        finally:
            client.close()
        assert items_sent(openai_server) == {"item-1": 1, "item-2": 1}
        assert openai_server.call_count == 1
    finally:
        celery_procs.stop()
        back.stop()
