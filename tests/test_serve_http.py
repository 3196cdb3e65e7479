"""`memq serve` over HTTP against a real uvicorn process and a real redis-server: keys and
scopes, problem+json errors, the hand-off, and what a user would check afterwards."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from memq.core.settings import MemqSettings
from tests.support.serve import Keys, bearer
from worker.queue import QueueClient

pytestmark = [pytest.mark.integration]

PROBLEM = "application/problem+json"


def turn(text: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": text},
        {"role": "assistant", "content": "Noted."},
    ]


def test_health_is_public_and_every_other_route_wants_a_key(
    settings: MemqSettings, serve_for: Any, api_keys: tuple[Keys, Any]
) -> None:
    keys, _ = api_keys
    server = serve_for(settings)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        assert http.get("/healthz").json() == {"status": "ok"}

        missing = http.get("/v1/users/alice/memory")
        assert missing.status_code == 401
        assert missing.headers["content-type"] == PROBLEM
        assert missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["status"] == 401

        wrong = http.get("/v1/users/alice/memory", headers=bearer("memq_not_a_key_at_all_000"))
        assert wrong.status_code == 401
        assert "memq_not_a_key" not in wrong.text  # a presented key is never echoed

        # A valid key without the scope is 403, not 401: the caller knows which to fix.
        scope = http.delete("/v1/users/alice", headers=bearer(keys.agent))
        assert scope.status_code == 403
        assert scope.headers["content-type"] == PROBLEM
        assert "admin" in scope.json()["detail"]

        unknown = http.get("/v1/nothing-here", headers=bearer(keys.admin))
        assert unknown.status_code == 404
        assert unknown.headers["content-type"] == PROBLEM
    assert keys.admin not in server.log_text() and keys.agent not in server.log_text()


def test_a_hand_off_is_accepted_once_redis_holds_it(
    settings: MemqSettings, serve_for: Any, api_keys: tuple[Keys, Any], redis_client: Any
) -> None:
    keys, _ = api_keys
    server = serve_for(settings)
    body = {"thread_id": "t-1", "messages": turn("I keep bees on my roof."), "flush": True}
    with httpx.Client(base_url=server.url, timeout=10) as http:
        answer = http.post("/v1/users/alice/conversations", json=body, headers=bearer(keys.agent))
        assert answer.status_code == 202, answer.text
        accepted = answer.json()
        assert accepted["status"] == "queued"
    stats = QueueClient(settings, redis_client).stats()
    assert stats["due"] == 1
    log = server.log_text()
    # The access log names the route, never the path (a user id) or the body.
    assert "POST /v1/users/{user_id}/conversations 202" in log
    assert "bees" not in log and "/users/alice" not in log


def test_with_redis_hung_hand_offs_are_spooled_bad_ones_still_refused_then_replayed(
    aof_redis: Any, make_settings: Any, serve_for: Any, api_keys: tuple[Keys, Any]
) -> None:
    import os
    import signal

    import redis

    from memq.testing.waiting import wait_for

    keys, _ = api_keys
    settings: MemqSettings = make_settings(
        redis_url=aof_redis.url, producer_timeout_seconds=0.3, debounce_seconds=60
    )
    server = serve_for(settings)
    assert aof_redis.process is not None
    os.kill(aof_redis.process.pid, signal.SIGSTOP)  # connections hang: the worst case
    try:
        with httpx.Client(base_url=server.url, timeout=5, headers=bearer(keys.agent)) as http:
            statuses = []
            for n in range(6):
                body = {"thread_id": f"hung-{n % 3}", "messages": turn(f"I collect stamp {n}.")}
                answer = http.post("/v1/users/ines/conversations", json=body)
                assert answer.status_code == 202, answer.text
                statuses.append(answer.json()["status"])
            # Input memq cannot take is refused as ever, Redis or not.
            bad = {"thread_id": "a\u0000b", "messages": turn("x")}
            assert http.post("/v1/users/ines/conversations", json=bad).status_code == 422
            empty = {"thread_id": "t", "messages": [{"role": "user", "content": "hi"}]}
            answer = http.post("/v1/users/ines/conversations", json=empty)
            assert answer.json()["status"] == "nothing_to_remember"
    finally:
        os.kill(aof_redis.process.pid, signal.SIGCONT)
    assert statuses == ["spooled"] * 6
    client = redis.Redis.from_url(aof_redis.url, decode_responses=True)
    try:
        queue = QueueClient(settings, client)
        wait_for(lambda: queue.stats()["due"] == 3, what="the spool replayed")
    finally:
        client.close()


def test_management_over_http_is_the_cli_s_management(
    settings: MemqSettings, serve_for: Any, api_keys: tuple[Keys, Any], redis_client: Any
) -> None:
    keys, _ = api_keys
    server = serve_for(settings)
    with httpx.Client(base_url=server.url, timeout=10, headers=bearer(keys.admin)) as http:
        added = http.post(
            "/v1/users/jo/facts",
            json={"content": "Jo writes Rust", "category": "knowledge", "agent_name": "Coder"},
        )
        assert added.status_code == 201, added.text
        fact_id = added.json()["id"]
        typo = http.post("/v1/users/jo/facts", json={"content": "x", "category": "knowlege"})
        assert typo.status_code == 422 and "did you mean 'knowledge'" in typo.json()["detail"]

        edited = http.patch(
            f"/v1/users/jo/facts/{fact_id}", json={"agent_name": "coder", "confidence": 0.4}
        )
        assert edited.json()["confidence"] == 0.4
        missing = http.patch("/v1/users/jo/facts/fact_nope", json={"agent_name": "coder"})
        assert missing.status_code == 404
        assert missing.headers["content-type"] == PROBLEM

        deerflow = http.get(
            "/v1/users/jo/export", params={"agent_name": "coder", "format": "deerflow"}
        )
        assert deerflow.json()["facts"][0]["createdAt"].endswith("Z")  # DeerFlow's shape
        imported = http.put("/v1/users/kim/memory", json=deerflow.json())
        assert imported.json() == {"facts": 1}
        assert [f["content"] for f in http.get("/v1/users/kim/facts").json()["facts"]] == [
            "Jo writes Rust"
        ]
        refused = http.put("/v1/users/kim/memory", json={"hello": "world"})
        assert refused.status_code == 422
        assert http.get("/v1/users/kim/facts").json()["facts"]  # a bad import changed nothing

        deleted = http.delete(f"/v1/users/jo/facts/{fact_id}", params={"agent_name": "coder"})
        assert deleted.json()["id"] == fact_id
        actions = [
            c["action"]
            for c in http.get("/v1/users/jo/history", params={"agent_name": "coder"}).json()[
                "changes"
            ]
        ]
        assert actions == ["remove", "edit", "add"]

        assert http.get("/v1/dead-letters").json() == {"dead_letters": [], "next_cursor": None}
        assert http.post("/v1/dead-letters/retry", json={"ids": "all"}).json() == {"count": 0}
        assert http.get("/v1/queue/stats").json()["due"] == 0
        # No beat runs here: ready is false, and says why.
        ready = http.get("/readyz")
        assert ready.status_code == 503 and "beat is not ticking" in ready.json()["detail"]
