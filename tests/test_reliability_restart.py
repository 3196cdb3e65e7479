"""Reliability (issue 10, case 3): Redis restarted while an extraction is in flight.

The quiet shape that kills a kombu 5.7 worker every time: one worker (threads pool), one beat, a
model that answers after 2 s; one context flushed; once the model server holds the request (the
task message is unacked, the run is inside its LLM call) Redis goes away and comes back on the
same port and data folder — gracefully (SHUTDOWN) and by ``kill -9`` with AOF. Afterwards the
context is extracted exactly as if nothing happened, the worker is still there, nothing is lost
and a context enqueued after the restart is extracted too (the worker consumes again).

Each case prints its figures (runs, LLM calls, seconds from Redis back to the fact saved) for
docs/reliability.md.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from memq.core.connection import redis_client
from memq.local.redis_server import RedisServer
from memq.testing.redis_procs import kill_redis, shutdown_redis
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
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

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.integration]

MODEL_SECONDS = 2.0


def slow_model(request: dict[str, Any]) -> Reply:
    reply = learn_items(request)
    reply.delay_seconds = MODEL_SECONDS
    return reply


@pytest.mark.parametrize(
    ("stop", "pool", "contexts"),
    [
        (shutdown_redis, "threads", 1),
        (kill_redis, "threads", 1),
        (shutdown_redis, "prefork", 1),
        # A backlog: runs in flight and more messages waiting for a free slot of the worker.
        (shutdown_redis, "threads", 6),
    ],
    ids=["shutdown-threads", "kill-9-threads", "shutdown-prefork", "shutdown-threads-backlog"],
)
def test_a_redis_restart_with_extractions_in_flight_keeps_the_worker_and_the_work(
    stop: Any,
    pool: str,
    contexts: int,
    tmp_path: Path,
    aof_redis: RedisServer,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
) -> None:
    openai_server.responder = slow_model
    settings = stack_settings(
        make_settings,
        openai_server,
        redis_url=aof_redis.url,
        tick_seconds=0.5,
        debounce_seconds=3.0,
        lease_seconds=30.0,
    )
    env = memq_env(settings)
    concurrency = 8 if pool == "threads" and contexts == 1 else 2
    worker = celery_procs.start_worker(env, concurrency=concurrency, pool=pool)
    celery_procs.start_beat(env)
    users = [f"rita{n}" for n in range(contexts)]

    producer = producer_for(settings)
    for n, user in enumerate(users):
        assert producer.flush(f"t-restart-{n}", user, None, turn(f"item-{n}"))
    busy = min(contexts, concurrency)
    wait_for(lambda: openai_server.call_count >= busy, what="the model holds requests")
    time.sleep(0.3)  # wait-ok: the repro's shape — well inside the 2 s call, task in flight

    stop(aof_redis)
    down_at = time.monotonic()
    time.sleep(1.0)  # wait-ok: the outage itself (Redis is down for this long)
    aof_redis.start()
    back_at = time.monotonic()

    def missing() -> list[str]:
        return [
            user
            for n, user in enumerate(users)
            if facts_of(settings, user) != [fact_for(f"item-{n}")]
        ]

    wait_for(
        lambda: not missing(),
        interval=0.1,
        what="every context in flight extracted after the restart"
        + ("" if worker.alive() else f" (worker exited {worker.process.returncode})"),
    )
    recovered_at = time.monotonic()
    calls_before = openai_server.call_count

    # The worker consumes again: a context enqueued now is extracted by the same process.
    assert producer.flush("t-after", "rita-after", None, turn("item-99"))
    wait_for(
        lambda: facts_of(settings, "rita-after") == [fact_for("item-99")],
        interval=0.1,
        what="a context enqueued after the restart extracted",
    )
    consuming_after = time.monotonic() - recovered_at
    client = redis.Redis.from_url(aof_redis.url, decode_responses=True)
    try:
        queue = QueueClient(settings, client)
        wait_for(lambda: queue_idle(queue), what="the queue drained")
        stats = queue.stats()
    finally:
        client.close()

    assert worker.alive(), f"the worker exited:\n{worker.log_text()[-3000:]}"
    assert "Unrecoverable error" not in worker.log_text()
    assert stats["dead"] == 0
    print(
        f"\n[redis restart {stop.__name__}, {pool} x{concurrency}, {contexts} context(s)] "
        f"outage {back_at - down_at:.1f} s; LLM calls {calls_before} for {contexts} context(s); "
        f"all saved {recovered_at - back_at:.1f} s after Redis returned; "
        f"a new context then took {consuming_after:.1f} s (2 s of it the model); "
        f"extractions counted {stats['completed_total']} "
        f"(incl. that one)"
    )


def test_a_client_with_outage_retries_rides_out_a_redis_restart(
    aof_redis: RedisServer, make_settings: Any
) -> None:
    """What a worker's own Redis client needs when a run ends while Redis restarts: the command
    waits for Redis instead of failing (which would leave the claim to its lease)."""
    settings = make_settings(redis_url=aof_redis.url)
    patient = redis_client(settings, outage_retries=8)
    impatient = redis_client(settings)
    try:
        patient.set("k", "before")
        shutdown_redis(aof_redis)
        with pytest.raises(redis.ConnectionError):
            impatient.get("k")  # the default: fail at once (producers, the CLI)
        restarter = threading.Timer(0.5, aof_redis.start)  # the outage lasts half a second
        restarter.start()
        started = time.monotonic()
        assert patient.get("k") == "before"  # issued while Redis is down, answered once it is up
        waited = time.monotonic() - started
        restarter.join()
        print(
            f"\n[outage retries] a command sent during a 0.5 s outage: answered in {waited:.1f} s"
        )
    finally:
        patient.close()
        impatient.close()
