"""worker/metrics.py and the task wrapper's bookkeeping: fields recorded into the shared Redis hash
read back as the same figures, and each way an extraction ends is counted once, under its name."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery.exceptions import Retry

from memq.core.errors import ExtractionDeadLettered
from memq.core.identity import ContextKey
from memq.core.settings import MemqSettings
from worker.celery_app import settle_task
from worker.metrics import (
    LATENCY_BUCKETS_SECONDS,
    MetricsRecorder,
    latency_bucket,
    parse_metrics,
    read_metrics,
    read_shards,
)
from worker.tasks import WorkerRuntime
from worker.tick import TickReport

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("seconds", "field"),
    [(0.0, "0.1"), (0.1, "0.1"), (0.11, "0.25"), (60.0, "60"), (121.0, "+Inf")],
)
def test_latency_lands_in_its_smallest_bucket(seconds: float, field: str) -> None:
    assert latency_bucket(seconds) == f"llm_latency_le:{field}"


def test_parse_accumulates_buckets_and_ignores_junk() -> None:
    snapshot = parse_metrics(
        {
            "llm_latency_le:0.1": "2",
            "llm_latency_le:1": "3",
            "llm_latency_le:+Inf": "1",
            "llm_latency_count": "6",
            "llm_latency_sum_ms": "4500",
            "extractions:updated": "4",
            "something_else": "not a number",
        }
    )
    assert len(snapshot.llm_latency_buckets) == len(LATENCY_BUCKETS_SECONDS) + 1
    assert dict(snapshot.llm_latency_buckets)[0.1] == 2
    assert dict(snapshot.llm_latency_buckets)[1.0] == 5
    assert snapshot.llm_latency_buckets[-1] == (float("inf"), 6)
    assert snapshot.llm_latency_sum_seconds == 4.5
    assert snapshot.extractions == {"updated": 4}
    assert snapshot.last_tick_ms is None and snapshot.dead_lettered == 0


def test_recorded_figures_read_back(settings: MemqSettings, redis_client: redis.Redis) -> None:
    recorder = MetricsRecorder.for_settings(settings, redis_client)
    recorder.llm_request("ok", 0.3)
    recorder.llm_request("rate_limited", 0.05)
    recorder.tick(TickReport(claimed=3, requeued=2, dead=1, deferred=4, released=5), 1234)
    recorder.extraction("dead")
    snapshot = read_metrics(redis_client, settings)
    assert snapshot.llm_requests == {"ok": 1, "rate_limited": 1}
    assert snapshot.llm_latency_count == 2 and snapshot.llm_latency_sum_seconds == 0.35
    assert (snapshot.tick_claimed, snapshot.leases_expired, snapshot.leases_dead) == (3, 2, 1)
    assert (snapshot.tick_deferred, snapshot.tick_released) == (4, 5)
    assert snapshot.last_tick_ms == 1234
    assert snapshot.dead_lettered == 2  # one failed run + one lease expired past its attempts
    (shard,) = read_shards(redis_client, settings, 0)
    assert (shard.due, shard.inflight, shard.dead, shard.oldest_due_lag_ms) == (0, 0, 0, 0)


def test_a_recording_lost_to_redis_never_raises(settings: MemqSettings) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    MetricsRecorder.for_settings(settings, dead).extraction("updated")  # logged, not raised


def test_each_end_of_a_run_is_counted_once_and_told_to_celery(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    runtime = WorkerRuntime(settings)
    context_id = ContextKey.create("t1", "zoe", "Coach").id
    results: list[dict[str, Any]] = [
        {"outcome": "updated", "queue": "done"},
        {"outcome": "unchanged", "queue": "rescheduled"},
        {"outcome": "stale"},  # lost its claim before it started
        {"outcome": "updated", "queue": "stale"},  # its save was refused: not an extraction
    ]
    for result in results:
        assert settle_task(runtime, context_id, result) is result
    with pytest.raises(Retry, match="retry scheduled by the queue: thread=t1 user=zoe agent=coach"):
        settle_task(
            runtime, context_id, {"outcome": "failed", "queue": "retry", "error": "TimeoutError"}
        )
    with pytest.raises(ExtractionDeadLettered, match="dead-lettered thread=t1 user=zoe"):
        settle_task(runtime, context_id, {"outcome": "failed", "queue": "dead", "error": "X"})
    assert read_metrics(redis_client, settings).extractions == {
        "updated": 1,
        "unchanged": 1,
        "retry": 1,
        "dead": 1,
    }
