"""P2: claiming 100 due contexts with 1k, 100k and 1M pending (``QueueClient.claim``: one
claim_due.lua, which reads its candidates itself). No peer baseline: the claim is shown as a cost
breakdown instead, its first step (the bare ``ZRANGEBYSCORE … LIMIT 0 100`` read, timed on its own
on the same set) against the whole claim, so the table says what the claim adds on top of the read
it cannot avoid.

The three queues live side by side in one Redis and are claimed in turn, round after round; after
each round the claimed ids go back to ``due`` (untimed), so every queue keeps its size. Then, at
the largest size, Redis's own ``INFO commandstats`` around each claim says what the script costs
the server (its EVALSHA time, free of the client and the network) and how many Redis calls it
makes: the figure claim_due.lua is written to keep small (calls per candidate).
"""

from __future__ import annotations

import time

import redis

from bench.common import BenchEnv, Result, fmt_ms, percentile
from memq.core.keys import QueueKeys
from memq.core.settings import MemqSettings
from worker.queue import QueueClient

BATCH = 100
FILL_CHUNK = 10_000
USERS = 1_000  # contexts are spread over this many users, so each claim checks ~100 user caps
PROFILED = 100  # claims at the largest size measured with INFO commandstats (30 was too few
# to resolve a 5 % change on a loaded machine)


def give_back(client: redis.Redis, q: QueueKeys, claimed: list[str], due_at_ms: int) -> None:
    """Put claimed ids back in ``due`` with no lease (untimed), so the queue keeps its size: no
    other lease is out, so every user's count goes."""
    pipe = client.pipeline(transaction=False)
    pipe.zrem(q.inflight, *claimed)
    pipe.delete(q.user_leases, q.claims)
    pipe.zadd(q.due, {context_id: due_at_ms for context_id in claimed})
    pipe.execute()


def profile(
    client: redis.Redis, queue: QueueClient, now: int
) -> tuple[float, float, dict[str, float]]:
    """The claim script's server time and the rest of each claim's wall time (the client's
    side and the round trip), p50 in seconds, and its Redis calls by command, per claim, read
    from INFO commandstats reset before each claim."""
    q = queue.keys.shard(0)
    usec: list[float] = []
    rest: list[float] = []
    calls: dict[str, float] = {}
    for _ in range(PROFILED):
        client.config_resetstat()
        t0 = time.perf_counter()
        batch = queue.claim(now, BATCH)
        wall = time.perf_counter() - t0
        stats = client.info("commandstats")
        usec.append(float(stats["cmdstat_evalsha"]["usec"]))
        rest.append(wall - usec[-1] / 1e6)
        for name, figures in stats.items():
            command = name.removeprefix("cmdstat_")
            if command not in ("evalsha", "config"):  # the script's own calls
                calls[command] = calls.get(command, 0) + figures["calls"] / PROFILED
        give_back(client, q, [c.context_id for c in batch.claims], now - 500)
    return percentile(usec, 50) / 1e6, percentile(rest, 50), calls


def fill(client: redis.Redis, q: QueueKeys, count: int, due_at_ms: int) -> None:
    """``count`` due contexts with minimal hashes, pipelined in chunks."""
    for start in range(0, count, FILL_CHUNK):
        ids = [f"t{i}:u{i % USERS}:a" for i in range(start, min(count, start + FILL_CHUNK))]
        pipe = client.pipeline(transaction=False)
        # Distinct scores across chunks: equal scores would sort by id, and the oldest 100 would
        # then all be one user's (every 1,000th id), hiding the per-user cap checks.
        pipe.zadd(q.due, {cid: due_at_ms - start - i for i, cid in enumerate(ids)})
        for cid in ids:
            pipe.hset(q.context(cid), "version", "1")
        pipe.execute()


def run(env: BenchEnv) -> Result:
    sizes = (1_000, 100_000) if env.quick else (1_000, 100_000, 1_000_000)
    rounds = 100 if env.quick else 300
    client = env.client()
    now = int(time.time() * 1000)
    queues: dict[int, tuple[QueueClient, MemqSettings]] = {}
    try:
        for size in sizes:
            settings = env.settings(
                max_inflight=10**9, max_inflight_per_user=10**9, claim_batch=BATCH
            )
            queue = QueueClient(settings, client)
            fill(client, queue.keys.shard(0), size, now - 1000)
            queues[size] = (queue, settings)
        claim_lat: dict[int, list[float]] = {size: [] for size in sizes}
        read_lat: dict[int, list[float]] = {size: [] for size in sizes}
        for index in range(rounds + 5):
            order = sizes if index % 2 else tuple(reversed(sizes))
            for size in order:
                queue, _ = queues[size]
                q = queue.keys.shard(0)
                t0 = time.perf_counter()
                client.zrangebyscore(q.due, "-inf", now, start=0, num=BATCH)
                t1 = time.perf_counter()
                batch = queue.claim(now, BATCH)
                t2 = time.perf_counter()
                if len(batch.claims) != BATCH:
                    raise RuntimeError(f"claimed {len(batch.claims)} of {BATCH} at {size}")
                if index >= 5:  # the first rounds warm the scripts and the connection
                    read_lat[size].append(t1 - t0)
                    claim_lat[size].append(t2 - t1)
                give_back(client, q, [c.context_id for c in batch.claims], now - 500)
        server, client_side, calls = profile(client, queues[sizes[-1]][0], now)
    finally:
        env.flush_redis()  # a million hashes are not left for the next benchmark
        client.close()
    p50 = {size: percentile(claim_lat[size], 50) for size in sizes}
    p99 = {size: percentile(claim_lat[size], 99) for size in sizes}
    largest, smallest = sizes[-1], sizes[0]
    flat = p50[largest] / p50[smallest]
    base = percentile(read_lat[largest], 50)
    return Result(
        key="P2",
        title=f"claim {BATCH} due keys at 1k / 100k / 1M pending",
        measured=", ".join(f"{size:,}: p50 {fmt_ms(p50[size])}" for size in sizes)
        + f"; {largest:,}/{smallest:,} = {flat:.2f}",
        baseline=f"no peer; cost breakdown at {largest:,}: the range read alone "
        f"{fmt_ms(base)}, the script's checks and moves "
        f"{fmt_ms(max(0.0, p50[largest] - base))}",
        goal="<= 1 ms, flat (1M/1k <= 1.3)",
        met=p50[largest] <= 0.001 and flat <= 1.3,
        details=[
            "p99: " + ", ".join(f"{size:,}: {fmt_ms(p99[size])}" for size in sizes),
            f"INFO commandstats at {largest:,}: claim_due.lua {fmt_ms(server)} of server time "
            f"(p50 of {PROFILED}), {sum(calls.values()):.0f} Redis calls per claim of {BATCH} ("
            + ", ".join(f"{name} {n:g}" for name, n in sorted(calls.items()))
            + f"); the rest of each claim (client, one round trip) {fmt_ms(client_side)}",
            f"{rounds} interleaved rounds; claimed ids returned to due between rounds",
            "the range read is the claim's own first command, timed alone: a share of the cost, "
            "not a competing design",
        ],
        note="" if largest == 1_000_000 else "quick run: 1M skipped",
    )
