"""Every size is bounded: the per-user in-flight cap, the claim's cost for a capped tenant, the
hand-off's and the context's byte caps, against a real redis-server."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from producer.enqueue import Enqueuer, EnqueueRequest
from worker.queue import QueueClient

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000


def enqueuer(settings: MemqSettings, client: redis.Redis) -> Enqueuer:
    return Enqueuer(
        client,
        KeySchema(settings.key_prefix, settings.shards),
        debounce_ms=settings.debounce_ms,
        max_delay_ms=settings.max_delay_ms,
        retention_ms=settings.context_retention_ms,
        # CMB
    )


def hand_off(enqueue: Enqueuer, key: ContextKey, now: int, messages: list[dict[str, str]]) -> Any:
    payload = json.dumps(messages, ensure_ascii=False, separators=(",", ":"))
    return enqueue(EnqueueRequest(key=key, messages_json=payload, flush=True), now)


def test_a_users_in_flight_cap_is_not_divided_by_the_shard_count(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    # One (user, agent) always lives in one shard, so dividing the cap by 64 shards left a user
    # one run at a time instead of 16.
    settings = make_settings(shards=64, max_inflight_per_user=16, max_inflight=2000)
    queue, enqueue = QueueClient(settings, redis_client), enqueuer(settings, redis_client)
    for i in range(20):
        hand_off(
            enqueue,
            ContextKey.create(f"t{i}", "alice", "writer"),
            T0,
            [{"role": "user", "content": f"turn {i}"}, {"role": "assistant", "content": "ok"}],
        )

    claimed = queue.claim(T0 + 1).claims

    assert len(claimed) == 16
