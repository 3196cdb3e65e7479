"""CTXCAP: one producer call onto a context that grew to 20 MB, with and without the hard
per-context cap (``context_max_bytes``), measured as Redis's own script time.

The hand-off is one that cannot take the string-comparison path (the agent summarised its
history, so the script must decode both lists to merge them): without a cap, every such call
decodes the whole 20 MB and every other producer call of the shard waits behind it. With the cap,
the first call cuts the stored list to its newest ``context_max_bytes`` by string search before
decoding anything, and the later calls decode at most that much.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import redis

from bench.common import BenchEnv, Result
from bench.guard import Ratio
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from producer.enqueue import Enqueuer, EnqueueRequest

STORED_BYTES = 20_000_000
CALLS = 10


def _script_usec(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(stats.get(n, {}).get("usec", 0)) for n in ("cmdstat_evalsha", "cmdstat_eval"))


def _per_call_ms(env: BenchEnv, settings: MemqSettings, cap: int | None) -> list[float]:
    client = env.client()
    keys = KeySchema(settings.key_prefix)
    enqueue = Enqueuer(
        client,
        keys,
        debounce_ms=settings.debounce_ms,
        max_delay_ms=settings.max_delay_ms,
        context_max_bytes=cap,
    )
    key = ContextKey.create("th", "heavy", None)
    turn = [{"role": "user", "content": "x" * 480}, {"role": "assistant", "content": "ok"}]
    count = STORED_BYTES // len(json.dumps(turn, separators=(",", ":")))
    stored = json.dumps(turn * count, separators=(",", ":"))
    ctx = keys.for_context(key.id).context(key.id)
    client.hset(ctx, mapping={"messages": stored, "captured_ms": "1"})
    timings: list[float] = []
    now = int(time.time() * 1000)
    for n in range(CALLS):
        summary = json.dumps(
            [{"role": "user", "content": f"Summary {n}"}, {"role": "assistant", "content": "ok"}],
            separators=(",", ":"),
        )
        before = _script_usec(client)
        enqueue(EnqueueRequest(key, summary, captured_ms=now + n), now + n)
        timings.append((_script_usec(client) - before) / 1000)
    client.delete(ctx)
    client.close()
    return timings


def run(env: BenchEnv) -> Result:
    settings = env.settings()
    try:
        uncapped = _per_call_ms(env, settings, None)
        capped = _per_call_ms(env, settings, settings.context_max_bytes)
    finally:
        env.flush_redis()
    base, after = statistics.median(uncapped), statistics.median(capped[1:])
    return Result(
        key="CTXCAP",
        title="enqueue onto a 20 MB context, a hand-off that must be decoded",
        measured=f"context_max_bytes={settings.context_max_bytes:,}: first call "
        f"{capped[0]:.1f} ms (cuts the 20 MB), later calls median {after:.1f} ms",
        baseline=f"no cap, same run: median {base:.1f} ms on every call; ratio {base / after:.1f}x",
        goal="later calls <= 1/5 of the uncapped ones",
        met=after * 5 <= base,
        ratios={"uncapped vs capped call": Ratio(base / after, "higher")},
        details=[f"{CALLS} calls each; script time from INFO commandstats"],
    )
