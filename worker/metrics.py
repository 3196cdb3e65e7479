"""What the workers count, kept in one Redis hash so that every worker process on every host adds to
the same figures; `memq stats` and the Prometheus exporter read them back.

Counters are HINCRBY on fields of the metrics hash (``<prefix>:metrics``). The LLM latency
histogram is one field per bucket (each holds the count of that bucket alone; readers accumulate)
plus a count and a sum in milliseconds. The ticker's heartbeat is the time of its last tick.
Field names carry no user or thread ids, so the hash stays small whatever the traffic.

Recording never raises into a task: a figure lost to a Redis hiccup is better than an extraction
that fails because of its bookkeeping.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from memq.core.connection import RedisClient
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings

log = logging.getLogger(__name__)

# --- field names of the metrics hash (other modules write some of them; readers use these)
EXTRACTIONS = "extractions:"  # + outcome: updated, unchanged, skipped, retry, dead
LLM_REQUESTS = "llm_requests:"  # + result: ok, timeout, unreachable, rate_limited, ...
LLM_LATENCY_BUCKET = "llm_latency_le:"  # + upper bound in seconds, or +Inf
LLM_LATENCY_COUNT = "llm_latency_count"
LLM_LATENCY_SUM_MS = "llm_latency_sum_ms"
PROMPT_TOKENS = "prompt_tokens"
COMPLETION_TOKENS = "completion_tokens"
CACHED_TOKENS = "cached_tokens"  # of the prompt tokens, served from the provider's prompt cache
COST_NANO_USD = "cost_nano_usd"  # the bill at the configured price table, in 1e-9 dollars
BILLED_RUNS = "billed_runs"  # runs that called the model (the bill's "per extraction")
TURNS_EXTRACTED = "turns_extracted"  # new messages sent for extraction (the bill's "turns")
DEFERRED = "deferred:"  # + reason: rate_limit, budget (runs sent back to due, no attempt)
STALE_RUNS = "stale_runs"  # runs whose answer was discarded: they had lost their claim
FACTS_INVALID = "facts_invalid"  # new facts of saved answers dropped because they did not validate
FACTS_REFUSED = "facts_refused"  # new facts refused: only assistant messages said them
FORGETS = "forgets"
LAST_TICK_MS = "last_tick_ms"
TICK_CLAIMED = "tick_claimed"
TICK_RELEASED = "tick_released"  # claims handed back because the broker refused the send
TICK_DEFERRED = "tick_deferred"  # due contexts moved on because their user was at its cap
LEASES_EXPIRED = "leases_expired"  # put back in `due` by the reaper
LEASES_DEAD = "leases_dead"  # expired past max_attempts: dead-lettered by the reaper
CONTEXT_MESSAGES_CUT = "context_messages_cut"  # oldest messages cut to context_max_bytes

# updated/unchanged: saved; skipped: nothing new since the last run; retry/dead: failed.
EXTRACTION_OUTCOMES = ("updated", "unchanged", "skipped", "retry", "dead")
LATENCY_BUCKETS_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class TickFigures(Protocol):
    """What one tick reports (``worker.tick.TickReport``)."""

    @property
    def claimed(self) -> int: ...
    @property
    def released(self) -> int: ...
    @property
    def requeued(self) -> int: ...
    @property
    def dead(self) -> int: ...
    @property
    def deferred(self) -> int: ...


def usage_counters(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, cost_nano_usd: int, turns: int
) -> dict[str, int]:
    """The metrics-hash fields one run's token usage and bill add to."""
    return {
        PROMPT_TOKENS: prompt_tokens,
        COMPLETION_TOKENS: completion_tokens,
        CACHED_TOKENS: cached_tokens,
        COST_NANO_USD: cost_nano_usd,
        BILLED_RUNS: int(prompt_tokens > 0),
        TURNS_EXTRACTED: turns,
    }


def deferral_counters(reason: str) -> dict[str, int]:
    """The metrics-hash field a run sent back to `due` before its call adds to."""
    return {f"{DEFERRED}{reason}": 1}


def latency_bucket(seconds: float) -> str:
    """The histogram field a latency lands in (its smallest upper bound)."""
    for bound in LATENCY_BUCKETS_SECONDS:
        if seconds <= bound:
            return f"{LLM_LATENCY_BUCKET}{bound:g}"
    return f"{LLM_LATENCY_BUCKET}+Inf"


class MetricsRecorder:
    """Adds to the shared metrics hash; one round trip per call, errors logged, never raised."""

    def __init__(self, client: RedisClient, key: str) -> None:
        self._client = client
        self._key = key

    @classmethod
    def for_settings(cls, settings: MemqSettings, client: RedisClient) -> MetricsRecorder:
        return cls(client, KeySchema(settings.key_prefix, settings.shards).metrics())

    def extraction(self, outcome: str) -> None:
        self._add({f"{EXTRACTIONS}{outcome}": 1})

    def llm_request(self, result: str, seconds: float) -> None:
        self._add(
            {
                f"{LLM_REQUESTS}{result}": 1,
                latency_bucket(seconds): 1,
                LLM_LATENCY_COUNT: 1,
                LLM_LATENCY_SUM_MS: max(0, round(seconds * 1000)),
            }
        )

    def tick(self, report: TickFigures, now_ms: int) -> None:
        """The heartbeat (always written, so "beat is down" is one alert) and the tick's counts."""
        self._add(
            {
                TICK_CLAIMED: report.claimed,
                TICK_RELEASED: report.released,
                TICK_DEFERRED: report.deferred,
                LEASES_EXPIRED: report.requeued,
                LEASES_DEAD: report.dead,
            },
            latest={LAST_TICK_MS: now_ms},
        )

    def _add(self, counters: Mapping[str, int], latest: Mapping[str, int] | None = None) -> None:
        try:
            pipe = self._client.pipeline(transaction=False)
            for name, amount in counters.items():
                if amount:
                    pipe.hincrby(self._key, name, amount)
            for name, value in (latest or {}).items():
                pipe.hset(self._key, name, value)
            pipe.execute()
        except redis.RedisError as exc:
            log.debug("metrics not recorded: %s", exc)


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """The metrics hash, read into named figures (absent fields are zero)."""

    extractions: dict[str, int] = field(default_factory=dict)
    llm_requests: dict[str, int] = field(default_factory=dict)
    deferred: dict[str, int] = field(default_factory=dict)  # by reason
    # (upper bound in seconds, cumulative count), ending with +Inf
    llm_latency_buckets: list[tuple[float, int]] = field(default_factory=list)
    llm_latency_count: int = 0
    llm_latency_sum_seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_nano_usd: int = 0
    billed_runs: int = 0
    turns_extracted: int = 0
    stale_runs: int = 0
    facts_invalid: int = 0
    facts_refused: int = 0
    forgets: int = 0
    last_tick_ms: int | None = None
    tick_claimed: int = 0
    tick_released: int = 0
    tick_deferred: int = 0
    leases_expired: int = 0
    leases_dead: int = 0
    context_messages_cut: int = 0

    @property
    def cost_usd(self) -> float:
        return self.cost_nano_usd / 1_000_000_000

    @property
    def cached_share(self) -> float | None:
        """Cached tokens over prompt tokens (None before any)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def cost_per_extraction_usd(self) -> float | None:
        return self.cost_usd / self.billed_runs if self.billed_runs else None

    @property
    def cost_per_1000_turns_usd(self) -> float | None:
        return self.cost_usd * 1000 / self.turns_extracted if self.turns_extracted else None

    @property
    def dead_lettered(self) -> int:
        """Contexts ever moved to the dead letters (by a failed run or by the lease reaper)."""
        return self.extractions.get("dead", 0) + self.leases_dead


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def parse_metrics(raw: Mapping[str, Any]) -> MetricsSnapshot:
    """Pure: the hash's fields into a snapshot; unknown fields are ignored."""
    values = {str(k): _int(v) for k, v in raw.items()}
    by_prefix: dict[str, dict[str, int]] = {EXTRACTIONS: {}, LLM_REQUESTS: {}, DEFERRED: {}}
    for name, value in values.items():
        for prefix, found in by_prefix.items():
            if name.startswith(prefix):
                found[name.removeprefix(prefix)] = value
    cumulative = 0
    buckets: list[tuple[float, int]] = []
    for bound in (*LATENCY_BUCKETS_SECONDS, float("inf")):
        label = "+Inf" if bound == float("inf") else f"{bound:g}"
        cumulative += values.get(f"{LLM_LATENCY_BUCKET}{label}", 0)
        buckets.append((bound, cumulative))
    last_tick = values.get(LAST_TICK_MS)
    return MetricsSnapshot(
        extractions=by_prefix[EXTRACTIONS],
        llm_requests=by_prefix[LLM_REQUESTS],
        deferred=by_prefix[DEFERRED],
        llm_latency_buckets=buckets,
        llm_latency_count=values.get(LLM_LATENCY_COUNT, 0),
        llm_latency_sum_seconds=values.get(LLM_LATENCY_SUM_MS, 0) / 1000,
        prompt_tokens=values.get(PROMPT_TOKENS, 0),
        completion_tokens=values.get(COMPLETION_TOKENS, 0),
        cached_tokens=values.get(CACHED_TOKENS, 0),
        cost_nano_usd=values.get(COST_NANO_USD, 0),
        billed_runs=values.get(BILLED_RUNS, 0),
        turns_extracted=values.get(TURNS_EXTRACTED, 0),
        stale_runs=values.get(STALE_RUNS, 0),
        facts_invalid=values.get(FACTS_INVALID, 0),
        facts_refused=values.get(FACTS_REFUSED, 0),
        forgets=values.get(FORGETS, 0),
        last_tick_ms=last_tick or None,
        tick_claimed=values.get(TICK_CLAIMED, 0),
        tick_released=values.get(TICK_RELEASED, 0),
        tick_deferred=values.get(TICK_DEFERRED, 0),
        leases_expired=values.get(LEASES_EXPIRED, 0),
        leases_dead=values.get(LEASES_DEAD, 0),
        context_messages_cut=values.get(CONTEXT_MESSAGES_CUT, 0),
    )


@dataclass(frozen=True, slots=True)
class ShardGauges:
    """One shard of the queue, now."""

    shard: int
    due: int
    inflight: int
    dead: int
    oldest_due_lag_ms: int  # how far the oldest due context is past its deadline (0: none due)


def read_shards(client: RedisClient, settings: MemqSettings, now_ms: int) -> list[ShardGauges]:
    """Depths and lag of every shard, in one round trip."""
    schema = KeySchema(settings.key_prefix, settings.shards)
    shards = schema.all_shards()
    pipe = client.pipeline(transaction=False)
    for shard in shards:
        pipe.zcard(shard.due)
        pipe.zcard(shard.inflight)
        pipe.zcard(shard.dead)
        pipe.zrange(shard.due, 0, 0, withscores=True)
    replies = pipe.execute()
    gauges = []
    for index in range(len(shards)):
        due, inflight, dead, first = replies[index * 4 : index * 4 + 4]
        lag = max(0, now_ms - int(first[0][1])) if first else 0
        gauges.append(ShardGauges(index, int(due), int(inflight), int(dead), lag))
    return gauges


def read_metrics(client: RedisClient, settings: MemqSettings) -> MetricsSnapshot:
    schema = KeySchema(settings.key_prefix, settings.shards)
    return parse_metrics(client.hgetall(schema.metrics()))  # type: ignore[arg-type]
