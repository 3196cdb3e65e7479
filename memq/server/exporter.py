"""The Prometheus exporter: every scrape reads the queue and the workers' counters from Redis.

A custom collector rather than metric objects updated in this process: the figures belong to
Redis (the queue's sorted sets, the metrics hash every worker adds to), so any number of exporters
report the same numbers and a restarted exporter loses nothing. Labels are the shard, the
extraction outcome, the LLM request result and the reason a run was deferred — never a user or
thread id.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from memq.core.clock import now_ms
from memq.core.metrics import (
    BATCH_DEPTHS,
    COUNTERS,
    DEFERRAL_REASONS,
    EXTRACTION_OUTCOMES,
    MetricsSnapshot,
    read_snapshot,
)
from memq.core.settings import MemqSettings

if TYPE_CHECKING:
    from memq.core.connection import RedisClient

log = logging.getLogger(__name__)


class MemqCollector(Collector):
    """Collects memq's figures from Redis on each scrape; ``memq_up`` 0 when Redis is out."""

    def __init__(
        self, settings: MemqSettings, client: RedisClient, clock: Callable[[], int] = now_ms
    ) -> None:
        self._settings = settings
        self._client = client
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("memq_up", "1 when the exporter could read memq's Redis")
        try:
            read = read_snapshot(self._client, self._settings, self._clock())
        except Exception as exc:  # a scrape reports the outage, it does not fail
            log.warning("scrape: cannot read Redis: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        shards, snapshot = read.shards, read.metrics
        gauges = {
            "memq_due": ("Contexts waiting in `due` (debouncing or ready)", "due"),
            "memq_inflight": ("Contexts claimed and being extracted", "inflight"),
            "memq_dead": ("Contexts in the dead letters now", "dead"),
        }
        for name, (text, attribute) in gauges.items():
            family = GaugeMetricFamily(name, text, labels=["shard"])
            for shard in shards:
                family.add_metric([str(shard.shard)], getattr(shard, attribute))
            yield family
        for depth in BATCH_DEPTHS:
            family = GaugeMetricFamily(f"memq_{depth.name}", depth.text, labels=["shard"])
            for shard in shards:
                family.add_metric([str(shard.shard)], shard.batch.get(depth.name, 0))
            yield family
        lag = GaugeMetricFamily(
            "memq_oldest_due_lag_seconds",
            "How far the oldest due context is past its deadline (0 when none is due)",
            labels=["shard"],
        )
        for shard in shards:
            lag.add_metric([str(shard.shard)], shard.oldest_due_lag_ms / 1000)
        yield lag
        yield from self._counters(snapshot)
        heartbeat = GaugeMetricFamily(
            "memq_last_tick_timestamp_seconds",
            "Unix time of the ticker's last tick (0: never); beat is down when this stops moving",
        )
        heartbeat.add_metric([], (snapshot.last_tick_ms or 0) / 1000)
        yield heartbeat

    @staticmethod
    def _counters(snapshot: MetricsSnapshot) -> Iterator[Metric]:
        extractions = CounterMetricFamily(
            "memq_extractions",
            "Extraction runs by outcome: updated, unchanged, skipped (done), retry, dead (failed)",
            labels=["outcome"],
        )
        for outcome in sorted(set(EXTRACTION_OUTCOMES) | set(snapshot.extractions)):
            extractions.add_metric([outcome], snapshot.extractions.get(outcome, 0))
        yield extractions
        requests = CounterMetricFamily(
            "memq_llm_requests", "HTTP requests to the model by result", labels=["result"]
        )
        for result in sorted({"ok", *snapshot.llm_requests}):
            requests.add_metric([result], snapshot.llm_requests.get(result, 0))
        yield requests
        deferred = CounterMetricFamily(
            "memq_runs_deferred",
            "Runs sent back to `due` before their model call, no attempt counted, by reason "
            "(rate_limit: the shared rate limit; budget: a token budget)",
            labels=["reason"],
        )
        for reason in sorted({*DEFERRAL_REASONS, *snapshot.deferred}):
            deferred.add_metric([reason], snapshot.deferred.get(reason, 0))
        yield deferred
        latency = HistogramMetricFamily(
            "memq_llm_latency_seconds", "Duration of one request to the model"
        )
        latency.add_metric(
            [],
            buckets=[
                ("+Inf" if bound == float("inf") else f"{bound:g}", count)
                for bound, count in snapshot.llm_latency_buckets
            ],
            sum_value=snapshot.llm_latency_sum_seconds,
        )
        yield latency
        dead_lettered = CounterMetricFamily(
            "memq_dead_lettered",
            "Contexts moved to the dead letters (by a failed run or the lease reaper)",
        )
        dead_lettered.add_metric([], snapshot.dead_lettered)
        yield dead_lettered
        for entry in COUNTERS:
            counter = CounterMetricFamily(entry.exported, entry.text)
            counter.add_metric([], snapshot[entry.field] * entry.scale)
            yield counter


def build_registry(settings: MemqSettings, client: RedisClient) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MemqCollector(settings, client))
    return registry


def serve(
    settings: MemqSettings,
    client: RedisClient,
    address: str,
    port: int,
    stop: threading.Event,
) -> None:
    """Serve ``/metrics`` on ``address:port`` until ``stop`` is set."""
    from prometheus_client import start_http_server

    server, thread = start_http_server(
        port, addr=address, registry=build_registry(settings, client)
    )
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
