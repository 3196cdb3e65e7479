"""`memq serve` end to end: a real uvicorn process, a real Redis, a real Celery worker and beat
extracting with the real `openai` client against the scripted server, and the result read back
over HTTP — what an agent in another language sees."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.testing.waiting import wait_for
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import fact_for, learn_items, stack_settings, turn
from tests.support.serve import Keys, bearer

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def facts_over_http(http: httpx.Client, user: str) -> list[str]:
    answer = http.get(f"/v1/users/{user}/memory")
    assert answer.status_code == 200, answer.text
    return sorted(f["content"] for f in answer.json()["facts"])


def test_a_hand_off_over_http_is_extracted_and_read_back_over_http(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    serve_for: Any,
) -> None:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(make_settings, openai_server, debounce_seconds=0.5)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    server = serve_for(settings)
    keys = Keys()
    with httpx.Client(base_url=server.url, timeout=10, headers=bearer(keys.agent)) as http:
        body = {"thread_id": "chat-1", "messages": turn("item-1", "I sail on weekends.")}
        answer = http.post("/v1/users/app1-carol/conversations", json=body)
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "queued"
        wait_for(
            lambda: facts_over_http(http, "app1-carol") == [fact_for("item-1")],
            what="the fact visible over GET",
        )
        block = http.post("/v1/users/app1-carol/context", json={"query": "what do I own?"})
        assert block.status_code == 200
        assert fact_for("item-1") in block.json()["block"]
        assert block.json()["block"].startswith("<user_memory>")
        searched = http.post("/v1/users/app1-carol/facts/search", json={"query": "item-1"})
        assert [f["content"] for f in searched.json()["facts"]] == [fact_for("item-1")]
        history = http.get("/v1/users/app1-carol/history").json()["changes"]
        assert [c["action"] for c in history] == ["add"]
    logs = server.log_text() + celery_procs.logs()
    assert "sail" not in logs and keys.agent not in logs


def test_a_flush_over_http_is_extracted_on_the_next_tick(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    serve_for: Any,
) -> None:
    openai_server.responder = learn_items
    # A debounce far longer than the test: only the flush can make it in time.
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, debounce_seconds=300.0, max_delay_seconds=600.0
    )
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    server = serve_for(settings)
    with httpx.Client(base_url=server.url, timeout=10, headers=bearer(Keys().agent)) as http:
        debounced = {"thread_id": "slow", "messages": turn("item-7")}
        assert http.post("/v1/users/dave/conversations", json=debounced).status_code == 202
        flushed = {"thread_id": "fast", "messages": turn("item-8"), "flush": True}
        answer = http.post("/v1/users/dave/conversations", json=flushed)
        assert answer.status_code == 202
        assert answer.json()["deadline_ms"] <= _now_ms()  # due now, not in 300 s
        wait_for(
            lambda: facts_over_http(http, "dave") == [fact_for("item-8")],
            what="the flushed turn extracted",
        )
        # The debounced one still waits its debounce: the flush skipped it, not the queue.
        stats = httpx.get(
            server.url + "/v1/queue/stats", headers=bearer(Keys().admin), timeout=10
        ).json()
        assert stats["due"] == 1


def _now_ms() -> int:
    from memq.core.clock import now_ms

    return now_ms()


def test_with_redis_stopped_a_hand_off_is_still_202_and_extracted_once_redis_is_back(
    aof_redis: RedisServer,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    serve_for: Any,
) -> None:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, redis_url=aof_redis.url, producer_timeout_seconds=0.3
    )
    server = serve_for(settings)
    keys = Keys()
    with httpx.Client(base_url=server.url, timeout=10, headers=bearer(keys.agent)) as http:
        aof_redis.stop()
        body = {"thread_id": "t-outage", "messages": turn("item-3"), "flush": True}
        answer = http.post("/v1/users/erin/conversations", json=body)
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "spooled"
        second = {"thread_id": "t-outage-2", "messages": turn("item-4")}
        assert http.post("/v1/users/erin/conversations", json=second).json()["status"] == "spooled"
        # Reads during the outage fail with a problem, not a hang or a traceback.
        down = http.get("/v1/users/erin/memory")
        assert down.status_code == 503
        assert down.headers["content-type"] == "application/problem+json"

        restarted = RedisServer(aof_redis.data_dir, port=aof_redis.port, appendonly=True).start()
        try:
            env = memq_env(settings)
            celery_procs.start_worker(env, concurrency=2)
            celery_procs.start_beat(env)
            wait_for(
                lambda: facts_over_http(http, "erin") == [fact_for("item-3"), fact_for("item-4")],
                what="both spooled hand-offs extracted after Redis came back",
            )
        finally:
            celery_procs.stop()
            restarted.stop()
    assert "item-3" not in server.log_text()
