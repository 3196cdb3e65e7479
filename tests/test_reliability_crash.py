"""Reliability (issue 6): what production does to the processes around the queue.

A worker SIGKILLed in the middle of an LLM call, Redis restarted under load, Redis hanging while
agents keep talking. Real redis-server, real celery worker/beat subprocesses, the real `openai`
client against the scripted server; every wait has a deadline.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
import redis

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from producer import MemoryProducer
from producer import backoff as backoff_module
from storage import get_storage
from tests.support.attempts import counting_client
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import (
    fact_for,
    facts_of,
    learn_items,
    queue_idle,
    stack_settings,
    turn,
    update_answer,
)
from tests.support.waiting import wait_for
from worker.queue import QueueClient

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.integration]


def test_a_worker_killed_mid_extraction_is_replaced_and_the_update_applied_once(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    # The first call hangs (the worker dies in it); every later call answers at once.
    openai_server.script(Reply(content=update_answer(fact_for("item-1")), delay_seconds=30))
    openai_server.responder = learn_items
    settings = stack_settings(make_settings, openai_server, lease_seconds=3.0)
    env = memq_env(settings)
    doomed = celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    queue = QueueClient(settings, redis_client)

    assert producer_for(settings).flush("t-kill", "kim", None, turn("item-1"))
    wait_for(lambda: openai_server.call_count == 1, what="the first LLM call")
    assert queue.stats()["inflight"] == 1
    doomed.kill()  # SIGKILL: no warm shutdown, the task is neither acked nor failed

    celery_procs.start_worker(env, concurrency=2)
    wait_for(lambda: facts_of(settings, "kim"), what="the fact from the 2nd worker")
    wait_for(lambda: queue_idle(queue), what="the queue drained")

    assert facts_of(settings, "kim") == [fact_for("item-1")]  # applied once, no duplicate
    history = get_storage(settings).history("kim", None)
    assert [c.action for c in history] == ["add"]
    assert openai_server.call_count == 2  # the dead worker's call, then the replacement's
    stats = queue.stats()
    assert stats["dead"] == 0 and stats["completed_total"] == 1


def test_redis_restarted_under_load_loses_no_conversation(
    aof_redis: RedisServer,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
) -> None:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(
        make_settings,
        openai_server,
        redis_url=aof_redis.url,
        lease_seconds=5.0,
        producer_timeout_seconds=0.2,
    )
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_beat(env)
    producer = producer_for(settings)
    total = 40
    sent: list[int] = []
    errors: list[BaseException] = []
    restarted = threading.Event()

    def agents() -> None:
        try:
            for n in range(total):
                producer.after_agent(f"t{n}", f"u{n}", None, turn(f"item-{n}"))
                sent.append(n)
                if n >= total // 2:
                    restarted.wait(20)  # the second half spans the outage and the restart
                time.sleep(0.03)  # wait-ok: the pace of agents talking, not a settle wait
        except BaseException as exc:  # the hook must never raise; the test reports it if it does
            errors.append(exc)

    talker = threading.Thread(target=agents, daemon=True)
    talker.start()
    wait_for(lambda: len(sent) >= 10, what="agents under way")
    aof_redis.stop()  # graceful: SIGTERM, Redis fsyncs its AOF
    wait_for(lambda: producer.stats.spooled >= 3, what="the producer spooling")
    aof_redis.start()
    restarted.set()
    talker.join(30)
    assert not talker.is_alive() and not errors, errors
    assert sent == list(range(total))

    def missing() -> list[int]:
        return [n for n in range(total) if facts_of(settings, f"u{n}") != [fact_for(f"item-{n}")]]

    try:
        wait_for(lambda: not missing(), interval=0.25, what="every context extracted")
    except AssertionError as exc:
        client = redis.Redis.from_url(aof_redis.url, decode_responses=True)
        try:
            stats = QueueClient(settings, client).stats()
        finally:
            client.close()
        raise AssertionError(
            f"{exc}: missing {missing()}; queue {stats}; producer {producer.stats}; "
            f"worker alive {celery_procs.processes[0].alive()}\n" + celery_procs.logs()
        ) from None
    assert producer.stats.dropped == 0 and producer.spool_size == 0


def test_a_hung_redis_never_holds_up_the_agent_and_spooled_turns_are_extracted(
    aof_redis: RedisServer,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A back-off longer than the test: every call after the first failure falls inside it.
    monkeypatch.setattr(backoff_module, "BACKOFF_MIN_SECONDS", 600.0)
    monkeypatch.setattr(backoff_module, "BACKOFF_MAX_SECONDS", 600.0)
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, redis_url=aof_redis.url, producer_timeout_seconds=0.25
    )
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    client = counting_client(settings)
    producer = MemoryProducer(settings, redis=client)
    agent = threading.current_thread()
    assert aof_redis.process is not None
    pid = aof_redis.process.pid

    os.kill(pid, signal.SIGSTOP)  # accepts nothing, answers nothing: the worst case for a client
    try:
        for n in range(10):
            taken = producer.after_agent(f"t{n}", f"h{n}", None, turn(f"item-{n}"))
            assert taken is False  # never raised, reported as not sent, returned while frozen
        # One command timed out (bounded by the socket timeout); the back-off spared the other
        # nine calls the wait: they went straight to the spool.
        assert client.attempts_from(agent) == 1
    finally:
        os.kill(pid, signal.SIGCONT)
    assert producer.stats.spooled == 10
    try:
        assert producer.drain_spool() == 10  # Redis is back: the spool replays
    finally:
        producer.close()
        client.close()

    def all_extracted() -> bool:
        return all(facts_of(settings, f"h{n}") == [fact_for(f"item-{n}")] for n in range(10))

    wait_for(all_extracted, interval=0.25, what="the spooled turns extracted")
    assert producer.stats.replayed == 10 and producer.stats.dropped == 0
