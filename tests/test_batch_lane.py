"""The batch lane end to end: a real Celery worker and beat, a real Redis, the real `openai`
client against the scripted server's files and batches endpoints.

Work that can wait (due, not flushed) goes out in a batch job and its answers are applied once,
through the same fenced save as a synchronous run; flushes stay synchronous; a job out survives a
worker SIGKILL and a Redis restart, and outlives the lease; a user forgotten while the job is out
gets nothing written back; an expired or failed job falls back to synchronous calls; messages that
arrive while the job is out are extracted afterwards, and only they.
"""

from __future__ import annotations

from typing import Any

import pytest

from memq.core.connection import redis_client
from memq.core.settings import MemqSettings
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
        timeout=30,
        what=f"{count} requests out in batch jobs",
    )


def conversations(requests: list[dict[str, Any]]) -> str:
    return "\n".join(conversation_of(line["body"]) for line in requests)


def test_due_contexts_go_out_in_one_job_and_are_applied_once(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs, producer_for: Any
) -> None:
    settings = lane_settings(make_settings, openai_server)
    start(celery_procs, settings)
    producer = producer_for(settings)
    for n, user in enumerate(USERS):
        assert producer.after_agent(f"t-{n}", user, None, turn(f"item-{n}", "<user_memory>\u202e"))

    requests = out_requests(openai_server, len(USERS))
    assert len(openai_server.batches.jobs) == 1  # gathered into one job
    assert openai_server.call_count == 0  # nothing synchronous
    assert all(facts_of(settings, user) == [] for user in USERS)  # nothing applied yet
    assert all(f"item-{n}" in conversations(requests) for n in range(len(USERS)))
    assert depths(settings)["batch_out"] == len(USERS)

    openai_server.batches.complete()
    wait_for(lambda: depths(settings)["batch_jobs"] == 0, timeout=30, what="job settled")
    assert [facts_of(settings, user) for user in USERS] == [
        [fact_for(f"item-{n}")] for n in range(len(USERS))
    ]
    counts = metrics(settings)
    assert counts["batch_prompt_tokens"] == 100 * len(USERS)
    assert counts["batch_completion_tokens"] == 20 * len(USERS)
    assert counts.get("prompt_tokens", 0) == 0  # batch tokens are counted apart
    assert counts["batch_applied"] == len(USERS)
    assert openai_server.call_count == 0
    assert len(openai_server.batches.jobs) == 1
    assert depths(settings) == {"batch_pending": 0, "batch_out": 0, "batch_jobs": 0}
    assert queue_idle(QueueClient(settings, redis_client(settings)))


def test_a_flush_stays_synchronous(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs, producer_for: Any
) -> None:
    settings = lane_settings(make_settings, openai_server)
    start(celery_procs, settings)
    producer = producer_for(settings)
    assert producer.flush("t-flush", USERS[0], None, turn("item-7"))
    wait_for(lambda: facts_of(settings, USERS[0]) != [], timeout=30, what="flush extracted")
    assert facts_of(settings, USERS[0]) == [fact_for("item-7")]
    assert openai_server.call_count == 1
    assert openai_server.batches.jobs == {}
