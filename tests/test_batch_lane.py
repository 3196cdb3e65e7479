"""The batch lane end to end: a real Celery worker and beat, a real Redis, the real `openai`
client against the scripted server's files and batches endpoints.

Work that can wait (due, not flushed) goes out in a batch job and its answers are applied once,
through the same fenced save as a synchronous run; flushes stay synchronous; a job out survives a
worker SIGKILL and a Redis restart, and outlives the lease; a user forgotten while the job is out
gets nothing written back; an expired or failed job falls back to synchronous calls; messages that
arrive while the job is out are extracted afterwards, and only they.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from memq.core.clock import now_ms
from memq.core.connection import redis_client
from memq.core.metrics import read_snapshot
from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.testing.redis_procs import shutdown_redis
from storage import get_storage
from storage.erasure import erase
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
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
from worker.batch_queue import BatchQueue
from worker.queue import QueueClient

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

# Real ids, and text that must reach the model as text.
USERS = ("alice@example.com", "auth0|abc", "李雷")


def lane_settings(make_settings: Any, server: ScriptedOpenAI, **overrides: Any) -> MemqSettings:
    server.responder = learn_items
    values: dict[str, Any] = {
        "llm_batch_enabled": True,
        "llm_batch_gather_seconds": 0.0,
        "llm_batch_poll_seconds": 0.2,
        "debounce_seconds": 0.0,
    }
    values.update(overrides)
    return stack_settings(make_settings, server, **values)


def start(celery_procs: CeleryProcs, settings: MemqSettings) -> Any:
    env = memq_env(settings)
    worker = celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    return worker


def depths(settings: MemqSettings) -> dict[str, int]:
    client = redis_client(settings)
    try:
        return BatchQueue(settings, client).depths()
    finally:
        client.close()


def lane_locked(settings: MemqSettings) -> bool:
    """Whether a batch cycle holds the shard's lock (a kill then holds up the lane a while)."""
    client = redis_client(settings)
    try:
        return bool(client.exists(QueueClient(settings, client).keys.shard(0).batch_lock))
    finally:
        client.close()


def wait_recorded(settings: MemqSettings, count: int) -> None:
    """Until ``count`` contexts are recorded as out (the provider has the job before memq records
    it) and the cycle that recorded them is over."""
    wait_for(
        lambda: depths(settings)["batch_out"] == count and not lane_locked(settings),
        what="the job recorded and its cycle over",
    )


def settled(settings: MemqSettings, counter: str) -> dict[str, int] | None:
    """The metrics once no job is out and the cycle that settled it has counted ``counter``: a
    cycle counts its work after its last shard, so an empty job set alone can be seen first."""
    if depths(settings)["batch_jobs"]:
        return None
    counts = metrics(settings)
    return counts if counter in counts else None


def metrics(settings: MemqSettings) -> dict[str, int]:
    client = redis_client(settings)
    try:
        return {
            str(k): int(v)
            for k, v in client.hgetall(QueueClient(settings, client).keys.metrics()).items()
        }
    finally:
        client.close()


def out_requests(server: ScriptedOpenAI, count: int) -> list[dict[str, Any]]:
    """Wait until jobs in progress hold ``count`` requests; those requests."""
    return wait_for(
        lambda: (
            (found := server.batches.requests_of("in_progress")) and len(found) >= count and found
        ),
        what=f"{count} requests out in batch jobs",
    )


def last_tick_ms(settings: MemqSettings) -> int:
    client = redis_client(settings)
    try:
        return read_snapshot(client, settings, 0).metrics.last_tick_ms or 0
    finally:
        client.close()


def wait_for_ticks_past(settings: MemqSettings, since_ms: int, what: str) -> None:
    wait_for(lambda: last_tick_ms(settings) > since_ms, what=what)


def conversations(requests: list[dict[str, Any]]) -> str:
    return "\n".join(conversation_of(line["body"]) for line in requests)


def test_due_contexts_go_out_in_one_job_and_are_applied_once(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs, producer_for: Any
) -> None:
    # A job goes out as soon as it is full (three), long before the oldest waited 60 s.
    settings = lane_settings(
        make_settings, openai_server, llm_batch_max_requests=3, llm_batch_gather_seconds=60.0
    )
    start(celery_procs, settings)
    producer = producer_for(settings)
    for n, user in enumerate(USERS):
        assert producer.after_agent(f"t-{n}", user, None, turn(f"item-{n}", "<user_memory>\u202e"))

    requests = out_requests(openai_server, len(USERS))
    wait_recorded(settings, len(USERS))
    assert len(openai_server.batches.jobs) == 1  # gathered into one job
    assert openai_server.call_count == 0  # nothing synchronous
    assert all(facts_of(settings, user) == [] for user in USERS)  # nothing applied yet
    assert all(f"item-{n}" in conversations(requests) for n in range(len(USERS)))

    openai_server.batches.complete()
    counts = wait_for(lambda: settled(settings, "batch_applied"), what="job settled")
    assert [facts_of(settings, user) for user in USERS] == [
        [fact_for(f"item-{n}")] for n in range(len(USERS))
    ]
    assert counts["batch_prompt_tokens"] == 100 * len(USERS)
    assert counts["batch_completion_tokens"] == 20 * len(USERS)
    assert counts.get("prompt_tokens", 0) == 0  # batch tokens are counted apart
    assert counts["batch_applied"] == len(USERS)
    assert openai_server.call_count == 0
    assert len(openai_server.batches.jobs) == 1
    assert depths(settings) == {"batch_pending": 0, "batch_out": 0, "batch_jobs": 0}
    assert queue_idle(QueueClient(settings, redis_client(settings)))
    assert openai_server.batches.files == {}  # the prompts and answers deleted at the provider


def test_a_flush_stays_synchronous(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs, producer_for: Any
) -> None:
    settings = lane_settings(make_settings, openai_server)
    start(celery_procs, settings)
    producer = producer_for(settings)
    assert producer.flush("t-flush", USERS[0], None, turn("item-7"))
    wait_for(lambda: facts_of(settings, USERS[0]) != [], what="flush extracted")
    assert facts_of(settings, USERS[0]) == [fact_for("item-7")]
    assert openai_server.call_count == 1
    assert openai_server.batches.jobs == {}


def test_a_job_out_survives_a_worker_kill_a_redis_restart_and_the_lease_and_is_applied_once(
    aof_redis: RedisServer,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
) -> None:
    settings = lane_settings(
        make_settings, openai_server, redis_url=aof_redis.url, lease_seconds=2.0
    )
    worker = start(celery_procs, settings)
    producer = producer_for(settings)
    assert producer.after_agent("t-kill", USERS[1], None, turn("item-3"))
    out_requests(openai_server, 1)
    wait_recorded(settings, 1)

    worker.kill()  # SIGKILL: the job is out, no process of ours remembers it
    shutdown_redis(aof_redis)
    aof_redis.start()
    worker = celery_procs.restart(worker)
    # Several leases go by with the job still out: the reaper never brings the context back.
    wait_for_ticks_past(settings, now_ms() + 3 * settings.lease_ms, "three leases of ticks")
    assert depths(settings)["batch_out"] == 1
    assert openai_server.call_count == 0
    assert len(openai_server.batches.jobs) == 1

    openai_server.batches.complete()
    completed_at = time.monotonic()
    counts = wait_for(lambda: settled(settings, "batch_applied"), what="job settled")
    assert facts_of(settings, USERS[1]) == [fact_for("item-3")]
    assert openai_server.call_count == 0
    assert len(openai_server.batches.answered) == 1
    assert counts["batch_applied"] == 1
    print(
        f"batch out across SIGKILL + Redis restart + 3 leases: applied "
        f"{time.monotonic() - completed_at:.1f} s after the job completed, 1 request, "
        f"0 synchronous calls, facts {len(facts_of(settings, USERS[1]))}"
    )


def test_an_answer_that_comes_back_after_the_user_was_forgotten_writes_nothing(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs, producer_for: Any
) -> None:
    settings = lane_settings(make_settings, openai_server)
    start(celery_procs, settings)
    producer = producer_for(settings)
    assert producer.after_agent("t-forget", USERS[0], None, turn("item-5"))
    out_requests(openai_server, 1)
    wait_recorded(settings, 1)

    client = redis_client(settings)
    erase(settings, client, get_storage(settings, redis=client), USERS[0])
    openai_server.batches.complete()
    counts = wait_for(lambda: settled(settings, "batch_stale"), what="job settled")
    assert facts_of(settings, USERS[0]) == []
    assert get_storage(settings).list_users() == []
    assert counts["batch_stale"] == 1
    assert openai_server.call_count == 0
    assert depths(settings) == {"batch_pending": 0, "batch_out": 0, "batch_jobs": 0}


@pytest.mark.parametrize("ending", ["expired", "failed", "cancelled"])
def test_a_job_that_does_not_complete_falls_back_to_synchronous_calls(
    ending: str,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
) -> None:
    settings = lane_settings(
        make_settings, openai_server, llm_batch_max_requests=2, llm_batch_gather_seconds=60.0
    )
    start(celery_procs, settings)
    producer = producer_for(settings)
    for n, user in enumerate(USERS[:2]):
        assert producer.after_agent(f"t-{n}", user, None, turn(f"item-{n}"))
    out_requests(openai_server, 2)
    wait_recorded(settings, 2)

    if ending == "expired":  # one request answered before the window ended, one not
        openai_server.batches.expire(answered=1)
    elif ending == "failed":
        openai_server.batches.fail()
    else:
        openai_server.batches.cancel()
    ended_at = time.monotonic()
    wait_for(
        lambda: all(facts_of(settings, user) != [] for user in USERS[:2]),
        what="both contexts extracted",
    )
    assert [facts_of(settings, user) for user in USERS[:2]] == [
        [fact_for("item-0")],
        [fact_for("item-1")],
    ]
    print(f"batch {ending}: both extracted {time.monotonic() - ended_at:.1f} s after the end")
    synchronous = 1 if ending == "expired" else 2
    counts = wait_for(lambda: settled(settings, "batch_fallbacks"), what="job settled")
    assert openai_server.call_count == synchronous
    assert counts["batch_fallbacks"] == synchronous
    assert len(openai_server.batches.jobs) == 1  # a fallback never goes out in a batch again


def test_messages_arriving_while_the_job_is_out_are_extracted_afterwards(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs, producer_for: Any
) -> None:
    settings = lane_settings(make_settings, openai_server)
    start(celery_procs, settings)
    producer = producer_for(settings)
    first = turn("item-1")
    assert producer.after_agent("t-more", USERS[2], None, first)
    out_requests(openai_server, 1)
    assert producer.after_agent("t-more", USERS[2], None, first + turn("item-2"))
    # The new turn waits for the job: no second request, no synchronous call.
    wait_for_ticks_past(settings, now_ms() + 1000, "ticks after the new turn")
    assert len(openai_server.batches.requests_of()) == 1

    openai_server.batches.complete()
    wait_for(lambda: len(openai_server.batches.jobs) == 2, what="a second job")
    second = out_requests(openai_server, 1)
    assert "item-2" in conversations(second)
    assert "item-1" not in conversations(second)  # what the first job held is not sent again
    openai_server.batches.complete()
    # The provider holds the job a moment before the lane records it in `batch:jobs`: wait for
    # what it applies, not for the set to look empty.
    wait_for(
        lambda: sorted(facts_of(settings, USERS[2])) == [fact_for("item-1"), fact_for("item-2")],
        what="the second job applied",
    )
    wait_for(lambda: depths(settings)["batch_jobs"] == 0, what="both jobs settled")
    assert openai_server.call_count == 0
