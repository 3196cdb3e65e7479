"""What memq counts, kept in one Redis hash so that every worker process on every host adds to
the same figures; `memq stats` and the Prometheus exporter read them back through one snapshot.

:class:`MetricsRecorder` is the only writer of the metrics hash (``<prefix>:metrics``) and
:func:`read_snapshot` its only reader. Counters are HINCRBY on fields of the hash. The LLM
latency histogram is one field per bucket (each holds the count of that bucket alone; readers
accumulate) plus a count and a sum in milliseconds. The ticker's heartbeat is the time of its
last tick. Field names carry no user or thread ids, so the hash stays small whatever the traffic.

It sits in the bottom layer so that every writer, storage's erasure included, uses it.

Recording never raises into a task: a figure lost to a Redis hiccup (or to anything else) is
better than an extraction that fails because of its bookkeeping.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from memq.core.connection import RedisClient
from memq.core.keys import KeySchema, QueueKeys
from memq.core.settings import MemqSettings

log = logging.getLogger(__name__)

# --- field names of the metrics hash that carry a label (one field per value of the label)
EXTRACTIONS = "extractions:"  # + outcome: updated, unchanged, skipped, retry, dead
LLM_REQUESTS = "llm_requests:"  # + result: ok, timeout, unreachable, rate_limited, ...
DEFERRED = "deferred:"  # + reason: rate_limit, budget (runs sent back to due before their call)
LLM_LATENCY_BUCKET = "llm_latency_le:"  # + upper bound in seconds, or +Inf
LLM_LATENCY_COUNT = "llm_latency_count"
LLM_LATENCY_SUM_MS = "llm_latency_sum_ms"
LAST_TICK_MS = "last_tick_ms"

# updated/unchanged: saved; skipped: nothing new since the last run; retry/dead: failed.
EXTRACTION_OUTCOMES = ("updated", "unchanged", "skipped", "retry", "dead")
# rate_limit: the shared rate limit had no slot; budget: a token budget was spent.
DEFERRAL_REASONS = ("rate_limit", "budget")
NANO_USD_PER_USD: Final = 1_000_000_000
# The shape of `memq stats --json` and `/v1/queue/stats` (:func:`summarise`): raised whenever a
# field is renamed, moved or removed (CHANGELOG.md says what changed); adding one keeps it.
STATS_VERSION: Final = 1

# "Is beat alive?": its last tick is at most this old, and never less than ten ticks. The one
# threshold of /readyz, `memq doctor` and the MemqBeatDown alert (deploy/prometheus/alerts.yml,
# whose expression tests/test_liveness.py holds to it).
BEAT_ALIVE_SECONDS: Final = 30.0
BEAT_ALIVE_TICKS: Final = 10
LATENCY_BUCKETS_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True, slots=True)
class Counter:
    """One plain counter: its field in the hash (the exporter serves it as
    ``memq_<metric or field>_total``, its value times ``scale``) and what it counts (the
    exporter's help, the `memq stats` row)."""

    field: str
    text: str
    metric: str = ""
    scale: float = 1.0

    @property
    def exported(self) -> str:
        return f"memq_{self.metric or self.field}"


# Every plain counter. Adding one is one line here: the recorder accepts it (in ``usage`` or
# through :meth:`MetricsRecorder.count`), the snapshot reads it, `memq stats` and the exporter
# show it. A name not listed here is never written.
COUNTERS: Final[tuple[Counter, ...]] = (
    Counter("prompt_tokens", "prompt tokens"),
    Counter("cached_tokens", "prompt tokens: cached"),  # served from the provider's cache
    Counter("completion_tokens", "completion tokens"),
    # Integer nano-dollars so that HINCRBY adds exactly; the exporter serves dollars.
    Counter(
        "cost_nano_usd",
        "LLM cost at the configured price table (dollars; 0 without one)",
        metric="llm_cost_usd",
        scale=1 / NANO_USD_PER_USD,
    ),
    Counter("billed_runs", "runs that called the model (the bill's extractions)"),
    Counter("turns_extracted", "conversation messages sent for extraction (the bill's turns)"),
    Counter("stale_runs", "stale runs discarded (lost their claim)"),
    Counter("facts_invalid", "new facts of saved answers dropped: they did not validate"),
    Counter("facts_refused", "new facts refused: only assistant messages said them"),
    Counter(
        "citations_repaired",
        "new facts citing only the assistant's reply, re-attributed to the user's message",
    ),
    Counter(
        "answers_missing_fields",
        "saved answers that left out a list or a summary group (read as none)",
    ),
    Counter("removals_unknown", "removals ignored: the id named no fact of the memory"),
    Counter("forgets", "users forgotten"),
    Counter("tick_claimed", "queue: claimed and dispatched"),
    Counter("leases_expired", "queue: leases expired, back to due"),
    Counter("leases_dead", "queue: leases expired past max attempts, dead-lettered"),
    Counter("tick_released", "queue: released (broker refused the send)"),
    Counter("tick_deferred", "queue: deferred (user at in-flight cap)"),
    Counter("context_messages_cut", "messages cut to context_max_bytes"),
    Counter(
        "recall_fallbacks",
        "recalls ranked by words alone: the query's embedding failed or was late",
    ),
    Counter("facts_embedded", "fact texts embedded (extractions and `memq reembed`)"),
    Counter(
        "embedding_failures", "embedding calls of the workers that failed (facts left unembedded)"
    ),
    Counter("batch_prompt_tokens", "batch lane: prompt tokens (apart from prompt_tokens)"),
    Counter("batch_cached_tokens", "batch lane: prompt tokens: cached"),
    Counter("batch_completion_tokens", "batch lane: completion tokens"),
    Counter("batch_jobs_created", "batch lane: jobs created"),
    Counter("batch_requests_sent", "batch lane: requests sent in jobs"),
    Counter("batch_applied", "batch lane: answers applied"),
    Counter("batch_fallbacks", "batch lane: sent back to synchronous calls"),
    Counter("batch_stale", "batch lane: answers discarded (claim moved on)"),
)
COUNTER_FIELDS: Final = frozenset(c.field for c in COUNTERS)


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


def beat_alive_within_ms(tick_seconds: float) -> int:
    """How old beat's last tick may be while beat counts as alive (milliseconds)."""
    return int(max(BEAT_ALIVE_SECONDS, BEAT_ALIVE_TICKS * tick_seconds) * 1000)


def beat_alive(last_tick_ms: int | None, now_ms: int, tick_seconds: float) -> bool:
    """Whether beat ticks: a tick recorded, no older than :func:`beat_alive_within_ms`."""
    return last_tick_ms is not None and now_ms - last_tick_ms <= beat_alive_within_ms(tick_seconds)


def per_thousand_turns(value: float | None, turns: int) -> float | None:
    """``value`` per 1,000 turns: the bill's turns, conversation messages sent for extraction
    (``turns_extracted``). The one meaning `memq stats` and `memq eval` give the figure."""
    return None if value is None or turns <= 0 else value * 1000 / turns


def latency_bucket(seconds: float) -> str:
    """The histogram field a latency lands in (its smallest upper bound)."""
    for bound in LATENCY_BUCKETS_SECONDS:
        if seconds <= bound:
            return f"{LLM_LATENCY_BUCKET}{bound:g}"
    return f"{LLM_LATENCY_BUCKET}+Inf"


class MetricsRecorder:
    """Adds to the shared metrics hash; one round trip per call, errors logged, never raised.
    ``hold_llm_requests``: LLM request figures wait for the next write (every worker run ends in
    one: its extraction, stale run or deferral), one round trip per run instead of two."""

    def __init__(self, client: RedisClient, key: str, *, hold_llm_requests: bool = False) -> None:
        self._client = client
        self._key = key
        self._hold = hold_llm_requests
        self._held: dict[str, int] = {}
        self._held_lock = threading.Lock()

    @classmethod
    def for_settings(
        cls, settings: MemqSettings, client: RedisClient, *, hold_llm_requests: bool = False
    ) -> MetricsRecorder:
        key = KeySchema(settings.key_prefix, settings.shards).metrics()
        return cls(client, key, hold_llm_requests=hold_llm_requests)

    def extraction(self, outcome: str, usage: Mapping[str, int] | None = None) -> None:
        """One run ended with ``outcome``; ``usage`` adds to counters (tokens, facts dropped)."""
        self._add({f"{EXTRACTIONS}{outcome}": 1}, usage)

    def stale_run(self, usage: Mapping[str, int] | None = None) -> None:
        """A run that had lost its claim: nothing of it is kept, what it spent still counts."""
        self._add({"stale_runs": 1}, usage)

    def deferral(self, reason: str) -> None:
        """A run went back to `due` before its model call (``reason``: of DEFERRAL_REASONS)."""
        self._add({f"{DEFERRED}{reason}": 1})

    def forget(self) -> None:
        self._add({"forgets": 1})

    def count(self, **counters: int) -> None:
        """Add to named counters of :data:`COUNTERS`."""
        self._add({}, counters)

    def llm_request(self, result: str, seconds: float) -> None:
        figures = {
            f"{LLM_REQUESTS}{result}": 1,
            latency_bucket(seconds): 1,
            LLM_LATENCY_COUNT: 1,
            LLM_LATENCY_SUM_MS: max(0, round(seconds * 1000)),
        }
        if not self._hold:
            self._add(figures)
            return
        with self._held_lock:
            for name, amount in figures.items():
                self._held[name] = self._held.get(name, 0) + amount

    def tick(self, report: TickFigures, now_ms: int) -> None:
        """The heartbeat (always written, so "beat is down" is one alert) and the tick's counts."""
        self._add(
            {},
            {
                "tick_claimed": report.claimed,
                "tick_released": report.released,
                "tick_deferred": report.deferred,
                "leases_expired": report.requeued,
                "leases_dead": report.dead,
            },
            latest={LAST_TICK_MS: now_ms},
        )

    def queue_extraction(
        self, pipe: Any, outcome: str, usage: Mapping[str, int] | None = None
    ) -> bool:
        """:meth:`extraction`'s writes (and the held LLM figures) queued on ``pipe``, a plain
        pipeline another caller executes: a run's settlement and its figures then share one round
        trip. False, with nothing queued, when ``pipe`` is not on this recorder's own Redis (the
        caller then records with :meth:`extraction`). Their replies are the caller's to ignore:
        a figure that cannot be written is lost, never raised."""
        if getattr(pipe, "connection_pool", None) is not getattr(
            self._client, "connection_pool", 0
        ):
            return False
        try:
            self._queue(pipe, {f"{EXTRACTIONS}{outcome}": 1}, usage)
        except Exception as exc:
            log.debug("metrics not recorded: %s", exc)
        return True

    def _queue(
        self,
        pipe: Any,
        fields: Mapping[str, int],
        counters: Mapping[str, int] | None = None,
        latest: Mapping[str, int] | None = None,
    ) -> None:
        """The writes of ``fields``, ``counters`` and the held figures, queued on ``pipe``."""
        with self._held_lock:
            held, self._held = self._held, {}
        amounts = dict(fields)
        for name, amount in held.items():
            amounts[name] = amounts.get(name, 0) + amount
        for name, amount in (counters or {}).items():
            if name in COUNTER_FIELDS:
                amounts[name] = amounts.get(name, 0) + int(amount)
            else:
                log.warning("metrics: %r is not a counter of COUNTERS; not recorded", name)
        for name, amount in amounts.items():
            if amount:
                pipe.hincrby(self._key, name, amount)
        for name, value in (latest or {}).items():
            pipe.hset(self._key, name, value)

    def _add(
        self,
        fields: Mapping[str, int],
        counters: Mapping[str, int] | None = None,
        latest: Mapping[str, int] | None = None,
    ) -> None:
        # The one guard: whatever goes wrong here (Redis, a bad figure) is logged, never raised.
        try:
            pipe = self._client.pipeline(transaction=False)
            self._queue(pipe, fields, counters, latest)
            pipe.execute()
        except Exception as exc:
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
    counters: dict[str, int] = field(default_factory=dict)  # every field of COUNTERS
    last_tick_ms: int | None = None

    def __getitem__(self, counter: str) -> int:
        """A counter of :data:`COUNTERS` by its field name (0 when never recorded)."""
        return self.counters.get(counter, 0)

    @property
    def completed(self) -> int:
        """Runs that ended done: saved (updated, unchanged) or with nothing new (skipped)."""
        return sum(self.extractions.get(o, 0) for o in ("updated", "unchanged", "skipped"))

    @property
    def cost_usd(self) -> float:
        return self["cost_nano_usd"] / NANO_USD_PER_USD

    @property
    def cached_share(self) -> float | None:
        """Cached tokens over prompt tokens (None before any)."""
        prompt = self["prompt_tokens"]
        return self["cached_tokens"] / prompt if prompt else None

    @property
    def cost_per_extraction_usd(self) -> float | None:
        runs = self["billed_runs"]
        return self.cost_usd / runs if runs else None

    @property
    def cost_per_1000_turns_usd(self) -> float | None:
        return per_thousand_turns(self.cost_usd, self["turns_extracted"])

    def both_lanes(self, kind: str) -> int:
        """Tokens of ``kind`` (prompt, cached, completion) over both lanes."""
        return self[f"{kind}_tokens"] + self[f"batch_{kind}_tokens"]

    @property
    def dead_lettered(self) -> int:
        """Contexts ever moved to the dead letters (by a failed run or by the lease reaper)."""
        return self.extractions.get("dead", 0) + self["leases_dead"]


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
        counters={c.field: values.get(c.field, 0) for c in COUNTERS},
        last_tick_ms=last_tick or None,
    )


@dataclass(frozen=True, slots=True)
class BatchDepth:
    """One depth of the batch lane: its name (in `memq stats`, ``/v1/queue/stats`` and, as
    ``memq_<name>``, the exporter), the shard's zset it counts, and what it means."""

    name: str
    key: Callable[[QueueKeys], str]  # the shard's zset whose size this depth is
    text: str


# The batch lane's states, as depths: parked (`batch_pending`, waiting to be gathered into a
# job), out (`batch_out`, in a job the provider holds) and the jobs out themselves.
BATCH_DEPTHS: Final[tuple[BatchDepth, ...]] = (
    BatchDepth(
        "batch_pending", lambda q: q.batch_pending, "batch lane: contexts parked, waiting for a job"
    ),
    BatchDepth("batch_out", lambda q: q.batched, "batch lane: contexts out in a job"),
    BatchDepth("batch_jobs", lambda q: q.batch_jobs, "batch lane: jobs out at the provider"),
)


@dataclass(frozen=True, slots=True)
class ShardGauges:
    """One shard of the queue, now."""

    shard: int
    due: int
    inflight: int
    dead: int
    oldest_due_lag_ms: int  # how far the oldest due context is past its deadline (0: none due)
    batch: dict[str, int] = field(default_factory=dict)  # by the names of BATCH_DEPTHS


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The queue's depths per shard and the counters, read together."""

    shards: list[ShardGauges]
    metrics: MetricsSnapshot
    now_ms: int


def read_snapshot(client: RedisClient, settings: MemqSettings, now_ms: int) -> Snapshot:
    """Depths and lag of every shard and the metrics hash, in one round trip: what `memq stats`,
    ``QueueClient.stats`` and the exporter all show."""
    schema = KeySchema(settings.key_prefix, settings.shards)
    shards = schema.all_shards()
    pipe = client.pipeline(transaction=False)
    for shard in shards:
        pipe.zcard(shard.due)
        pipe.zcard(shard.inflight)
        pipe.zcard(shard.dead)
        pipe.zrange(shard.due, 0, 0, withscores=True)
        for depth in BATCH_DEPTHS:
            pipe.zcard(depth.key(shard))
    pipe.hgetall(schema.metrics())
    replies = pipe.execute()
    gauges = []
    width = 4 + len(BATCH_DEPTHS)
    for index in range(len(shards)):
        due, inflight, dead, first, *batch = replies[index * width : (index + 1) * width]
        lag = max(0, now_ms - int(first[0][1])) if first else 0
        depths = {d.name: int(n) for d, n in zip(BATCH_DEPTHS, batch, strict=True)}
        gauges.append(ShardGauges(index, int(due), int(inflight), int(dead), lag, depths))
    return Snapshot(gauges, parse_metrics(replies[-1]), now_ms)


def batch_depths(shards: list[ShardGauges]) -> dict[str, int]:
    """The batch lane's depths over every shard, by name."""
    return {d.name: sum(s.batch.get(d.name, 0) for s in shards) for d in BATCH_DEPTHS}


def read_counts(client: RedisClient, settings: MemqSettings) -> dict[str, int]:
    """Every field of the metrics hash as an integer (fields that are none left out): for a
    difference between two reads, which :func:`parse_metrics` then names."""
    raw = client.hgetall(KeySchema(settings.key_prefix, settings.shards).metrics())
    values: dict[str, int] = {}
    for name, value in raw.items():
        try:
            values[str(name)] = int(value)
        except (TypeError, ValueError):
            continue
    return values


def _outcome_order(outcome: str) -> tuple[int, str]:
    known = EXTRACTION_OUTCOMES.index(outcome) if outcome in EXTRACTION_OUTCOMES else 99
    return known, outcome


def summarise(snapshot: Snapshot) -> dict[str, Any]:
    """Everything `memq stats` knows, as plain data (what `--json` prints and ``/v1/queue/stats``
    serves, shape :data:`STATS_VERSION`): totals of the shards (the batch lane's depths
    included), each shard, the extractions by outcome, the LLM figures and every counter."""
    shards, metrics = snapshot.shards, snapshot.metrics
    last_tick = metrics.last_tick_ms
    return {
        "version": STATS_VERSION,
        "due": sum(s.due for s in shards),
        "inflight": sum(s.inflight for s in shards),
        "dead": sum(s.dead for s in shards),
        **batch_depths(shards),
        "oldest_due_lag_ms": max((s.oldest_due_lag_ms for s in shards), default=0),
        "last_tick_age_ms": None if last_tick is None else snapshot.now_ms - last_tick,
        "shards": [
            {
                "shard": s.shard,
                "due": s.due,
                "inflight": s.inflight,
                "dead": s.dead,
                **{d.name: s.batch.get(d.name, 0) for d in BATCH_DEPTHS},
                "oldest_due_lag_ms": s.oldest_due_lag_ms,
            }
            for s in shards
        ],
        "extractions": {
            outcome: metrics.extractions[outcome]
            for outcome in sorted(metrics.extractions, key=_outcome_order)
        },
        "completed_total": metrics.completed,
        "dead_lettered_total": metrics.dead_lettered,
        "llm_requests": dict(sorted(metrics.llm_requests.items())),
        "deferred": dict(sorted(metrics.deferred.items())),
        "llm_latency_mean_seconds": (
            metrics.llm_latency_sum_seconds / metrics.llm_latency_count
            if metrics.llm_latency_count
            else None
        ),
        **{c.field: metrics[c.field] for c in COUNTERS},
        "cached_share": metrics.cached_share,
        "llm_cost_usd": metrics.cost_usd,
        "cost_per_extraction_usd": metrics.cost_per_extraction_usd,
        "cost_per_1000_turns_usd": metrics.cost_per_1000_turns_usd,
    }
