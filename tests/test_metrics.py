"""memq/core/metrics.py, the one writer and the one reader of the metrics hash: fields recorded
into the shared Redis hash read back as the same figures, `memq stats`, the queue client and the
exporter read them through one snapshot, and the task wrapper tells Celery how each run ended."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import redis
from celery.exceptions import Retry

from memq.cli import main
from memq.core.errors import ExtractionDeadLettered
from memq.core.identity import ContextKey
from memq.core.metrics import (
    COUNTERS,
    LATENCY_BUCKETS_SECONDS,
    MetricsRecorder,
    latency_bucket,
    parse_metrics,
    read_snapshot,
)
from memq.core.settings import MemqSettings
from worker.celery_app import settle_task
from worker.queue import QueueClient
from worker.runtime import WorkerRuntime
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
    recorder.extraction("updated", {"prompt_tokens": 7, "completion_tokens": 2})
    recorder.stale_run({"prompt_tokens": 5})
    recorder.forget()
    read = read_snapshot(redis_client, settings, 0)
    snapshot = read.metrics
    assert snapshot.llm_requests == {"ok": 1, "rate_limited": 1}
    assert snapshot.llm_latency_count == 2 and snapshot.llm_latency_sum_seconds == 0.35
    assert (snapshot["tick_claimed"], snapshot["leases_expired"], snapshot["leases_dead"]) == (
        3,
        2,
        1,
    )
    assert (snapshot["tick_deferred"], snapshot["tick_released"]) == (4, 5)
    assert (snapshot["prompt_tokens"], snapshot["completion_tokens"]) == (12, 2)
    assert (snapshot["stale_runs"], snapshot["forgets"]) == (1, 1)
    assert snapshot.last_tick_ms == 1234
    assert snapshot.dead_lettered == 2  # one failed run + one lease expired past its attempts
    (shard,) = read.shards
    assert (shard.due, shard.inflight, shard.dead, shard.oldest_due_lag_ms) == (0, 0, 0, 0)


def test_held_llm_figures_are_written_with_the_run_s_figures_in_one_round_trip(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    recorder = MetricsRecorder.for_settings(settings, redis_client, hold_llm_requests=True)
    recorder.llm_request("timeout", 2.0)
    recorder.llm_request("ok", 0.3)
    assert read_snapshot(redis_client, settings, 0).metrics.llm_requests == {}
    recorder.extraction("updated", {"prompt_tokens": 7})
    snapshot = read_snapshot(redis_client, settings, 0).metrics
    assert snapshot.llm_requests == {"timeout": 1, "ok": 1}
    assert snapshot.llm_latency_count == 2 and snapshot.llm_latency_sum_seconds == 2.3
    assert snapshot.extractions == {"updated": 1} and snapshot["prompt_tokens"] == 7
    recorder.extraction("updated")  # held figures are written once
    assert read_snapshot(redis_client, settings, 0).metrics.llm_requests == {"timeout": 1, "ok": 1}


def test_a_name_that_is_not_a_counter_is_never_written(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    recorder = MetricsRecorder.for_settings(settings, redis_client)
    recorder.extraction("updated", {"extractions": 1, "failures": 1, "prompt_tokens": 3})
    recorder.count(dead=1)
    fields = redis_client.hgetall(QueueClient(settings, redis_client).keys.metrics())
    assert fields == {"extractions:updated": "1", "prompt_tokens": "3"}


def test_a_recording_that_redis_refuses_never_raises(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    key = QueueClient(settings, redis_client).keys.metrics()
    redis_client.set(key, "not a hash")  # every HINCRBY now fails with WRONGTYPE
    recorder = MetricsRecorder.for_settings(settings, redis_client)
    recorder.extraction("updated", {"prompt_tokens": 1})
    recorder.stale_run()
    recorder.forget()
    recorder.tick(TickReport(claimed=1), 5)
    assert redis_client.get(key) == "not a hash"


def test_stats_the_cli_and_the_queue_client_read_one_snapshot(
    settings: MemqSettings,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    recorder = MetricsRecorder.for_settings(settings, redis_client)
    recorder.extraction("updated", {"prompt_tokens": 9})
    recorder.extraction("skipped")
    recorder.tick(TickReport(claimed=2), 1_000)
    stats = QueueClient(settings, redis_client).stats(now=3_000)
    for name in ("redis_url", "key_prefix"):
        monkeypatch.setenv(f"MEMQ_{name.upper()}", str(getattr(settings, name)))
    capsys.readouterr()
    assert main(["stats", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    # Every figure the queue client reads, `memq stats --json` prints alike (the tick's age is
    # measured at each reader's own clock).
    same = [name for name in stats if name != "last_tick_age_ms"]
    assert {name: printed[name] for name in same} == {name: stats[name] for name in same}
    assert printed["last_tick_age_ms"] >= 2_000
    assert stats["extractions"] == {"updated": 1, "skipped": 1}
    assert stats["completed_total"] == 2 and stats["last_tick_age_ms"] == 2_000
    assert {c.field for c in COUNTERS} <= set(stats)
    assert (stats["prompt_tokens"], stats["tick_claimed"]) == (9, 2)


def test_a_recording_lost_to_redis_never_raises(
    settings: MemqSettings, caplog: pytest.LogCaptureFixture
) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    caplog.set_level(logging.DEBUG, logger="memq.core.metrics")
    MetricsRecorder.for_settings(settings, dead).extraction("updated")  # logged, not raised
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["metrics not recorded"]


def test_each_end_of_a_run_is_told_to_celery_and_counted_by_the_run_alone(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    runtime = WorkerRuntime(settings)
    context_id = ContextKey.create("t1", "zoe", "Coach").id
    results: list[dict[str, Any]] = [
        {"outcome": "updated", "queue": "done"},
        {"outcome": "unchanged", "queue": "rescheduled"},
        {"outcome": "stale"},  # lost its claim before it started
        {"outcome": "updated", "queue": "stale"},  # saved, then its claim went stale
        {"outcome": "failed", "queue": "stale"},
    ]
    for result in results:
        assert settle_task(runtime, context_id, result) is result
    with pytest.raises(Retry, match="retry scheduled by the queue: thread=t1 user=zoe agent=coach"):
        settle_task(
            runtime, context_id, {"outcome": "failed", "queue": "retry", "error": "TimeoutError"}
        )
    with pytest.raises(ExtractionDeadLettered, match="dead-lettered thread=t1 user=zoe"):
        settle_task(runtime, context_id, {"outcome": "failed", "queue": "dead", "error": "X"})
    # The run body counted each of them when it settled the queue; telling Celery adds nothing.
    assert read_snapshot(redis_client, settings, 0).metrics.extractions == {}
