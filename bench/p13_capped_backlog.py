"""CAPPED: Redis script time per tick while one tenant at its in-flight cap has 100,000 due
contexts, and another tenant flushes one thread per tick.

Before the bulk skip, every tick moved the capped tenant's whole backlog one tick back in ``due``
(a wall of 100,000 re-deferrals, 220-255 ms of script time, on every tick for as long as the
backlog lasted). The first tick still does that once: it is the baseline, measured in the same run,
on the same data. The later ticks each meet only ``2 x max_inflight_per_user`` of the backlog's
keys (queued behind each other from the tenant's deferral horizon).

Script time is Redis's own (``INFO commandstats``: the ``usec`` of EVALSHA/EVAL), so it does not
include the client's round trips; the tick's wall time is shown beside it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import redis

from bench.common import BenchEnv, Result, fmt_ms
from bench.guard import Ratio
from memq.core.keys import QueueKeys
from worker.queue import Claim, QueueClient
from worker.tick import run_tick

BACKLOG = 100_000
CAP = 16
FILL_CHUNK = 10_000
TICK_MS = 1000


def fill(client: redis.Redis, q: QueueKeys, due_at_ms: int, count: int) -> None:
    for start in range(0, count, FILL_CHUNK):
        ids = [f"t{i}:heavy:a" for i in range(start, min(count, start + FILL_CHUNK))]
        pipe = client.pipeline(transaction=False)
        pipe.zadd(q.due, {cid: due_at_ms - i for i, cid in enumerate(ids)})
        for cid in ids:
            pipe.hset(q.context(cid), "version", "1")
        pipe.execute()


def script_usec(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(
        int(stats.get(name, {}).get("usec", 0)) for name in ("cmdstat_evalsha", "cmdstat_eval")
    )


def run(env: BenchEnv) -> Result:
    ticks = 10 if env.quick else 30
    client = env.client()
    settings = env.settings(
        max_inflight_per_user=CAP, tick_seconds=TICK_MS / 1000, lease_seconds=600.0
    )
    queue = QueueClient(settings, client)
    q = queue.keys.shard(0)
    now = int(time.time() * 1000)
    sent: list[Claim] = []
    script_ms: list[float] = []
    wall_ms: list[float] = []
    try:
        fill(client, q, now - 1000, BACKLOG)
        # The heavy tenant already holds its CAP runs (live leases, counted as a claim counts
        # them).
        client.zadd(q.inflight, {f"run{i}:heavy:a": now + 600_000 for i in range(CAP)})
        client.hset(q.user_leases, "heavy", CAP)
        for k in range(ticks):
            tick_now = now + k * TICK_MS
            light = f"l{k}:light{k}:a"  # another tenant's flush, due now
            client.hset(q.context(light), "version", "1")
            client.zadd(q.due, {light: tick_now})
            before = script_usec(client)
            t0 = time.perf_counter()
            # A budget past the tick period, so the first tick walks the whole backlog (with
            # the default budget it stops after a second, before the other tenant's key).
            report = run_tick(queue, sent.append, clock=lambda t=tick_now: t, budget_ms=60_000)
            wall_ms.append((time.perf_counter() - t0) * 1000)
            script_ms.append((script_usec(client) - before) / 1000)
            if light not in {c.context_id for c in sent}:
                raise RuntimeError(f"tick {k}: the other tenant's flush was not claimed")
            if k == 0 and report.deferred < BACKLOG:
                raise RuntimeError(f"first tick deferred {report.deferred} of {BACKLOG}")
    finally:
        env.flush_redis()
        client.close()
    first, later = script_ms[0], statistics.median(script_ms[1:])
    ratio = first / later if later else float("inf")
    return Result(
        key="CAPPED",
        title=f"tick script time, one tenant capped with {BACKLOG:,} due contexts",
        measured=f"later ticks: median {later:.2f} ms of script time "
        f"(wall {statistics.median(wall_ms[1:]):.1f} ms)",
        baseline=f"first tick, which re-defers the whole backlog as every tick did before: "
        f"{first:.1f} ms of script time (wall {wall_ms[0]:.0f} ms); {ratio:.0f}x",
        goal="later ticks <= 1/20 of the first",
        met=later * 20 <= first,
        ratios={"first tick vs later ticks": Ratio(ratio, "higher")},
        details=[
            f"{ticks} ticks of {TICK_MS} ms; max_inflight_per_user={CAP}; the other tenant's "
            "flush claimed on every tick",
            f"max later tick: {max(script_ms[1:]):.2f} ms; "
            f"p50 wall per later tick: {fmt_ms(statistics.median(wall_ms[1:]) / 1000)}",
            "a backlog longer than 2 x cap x lease_seconds / tick_seconds keys is looked at "
            "whole again once per lease_seconds (the horizon's bound), not on every tick",
        ],
    )
