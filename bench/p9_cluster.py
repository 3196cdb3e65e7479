"""CLUSTER: one Redis against a local 3-master Redis Cluster, side by side in the same run.

* claim throughput: N due contexts over 48 shards, claimed by ``QueueClient.claim`` rounds (one
  pipelined candidate read across shards, then one claim script per shard with work);
* end-to-end extractions/s: contexts flushed by a producer, extracted by one Celery worker process
  (threads) with a scripted LLM, until the queue is empty (the broker stays on the one Redis);
* the shard balance: keys per master after the end-to-end run.

Skips with a message when a cluster cannot be started here (ports, redis-server). All masters
share this machine's cores with the benchmark and the worker, so the figures compare the code
paths (pipelining by node, scripts per slot), not the capacity of three real hosts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.common import (
    BenchEnv,
    Result,
    celery_stack,
    flush_backlog,
    llm_settings,
    scripted_llm,
    start_beat,
)
from memq.core.connection import RedisClient, redis_client
from memq.core.keys import CLUSTER_SLOTS, key_slot, shard_tag
from memq.core.settings import MemqSettings
from memq.local.redis_cluster import LocalCluster
from memq.memory.update import NewFact, UpdateAnswer
from memq.testing.openai_server import update_text
from memq.testing.replies import Reply
from memq.testing.waiting import wait_for
from worker.queue import QueueClient

SHARDS = 48
USERS = 1_000
FILL_CHUNK = 5_000
LLM_SECONDS = 0.02
THREADS = 8


def fill(client: RedisClient, queue: QueueClient, count: int, due_at_ms: int) -> None:
    """``count`` due contexts with minimal hashes, each in its shard, pipelined in chunks."""
    for start in range(0, count, FILL_CHUNK):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(count, start + FILL_CHUNK)):
            cid = f"t{i}:u{i % USERS}:a"
            q = queue.keys.for_context(cid)
            pipe.zadd(q.due, {cid: due_at_ms - i})
            pipe.hset(q.context(cid), "version", "1")
        pipe.execute()


def claim_rate(settings: MemqSettings, count: int) -> tuple[float, int]:
    """Claims per second until ``count`` due contexts are all in flight, and the rounds it took."""
    client = redis_client(settings)
    try:
        queue = QueueClient(settings, client)
        now = int(time.time() * 1000)
        fill(client, queue, count, now - 1000)
        warm = len(queue.claim(now, 1).claims)  # loads the scripts on every master, untimed
        claimed, rounds = warm, 0
        started = time.perf_counter()
        while claimed < count:
            batch = queue.claim(now)
            if not batch.claims:
                raise RuntimeError(f"claimed {claimed} of {count}, then nothing")
            claimed += len(batch.claims)
            rounds += 1
        return (count - warm) / (time.perf_counter() - started), rounds
    finally:
        client.close()


def answer(request: dict[str, Any]) -> Reply:
    fact = NewFact(content="User ships billing in Go", category="context", confidence=0.9)
    body = update_text(UpdateAnswer(new_facts=(fact,)))
    return Reply(content=body, delay_seconds=LLM_SECONDS)


def extraction_rate(env: BenchEnv, redis_url: str, contexts: int) -> float:
    """Extractions per second of one worker process with ``THREADS`` threads."""
    with scripted_llm(answer) as server:
        settings = llm_settings(
            env,
            server,
            redis_url=redis_url,
            broker_url=env.redis_url,
            shards=SHARDS,
            storage="redis",
            tick_seconds=0.2,
            debounce_seconds=30.0,
            max_delay_seconds=300.0,
            max_inflight=contexts,
            redis_max_connections=64,
        )
        client = redis_client(settings)
        queue = QueueClient(settings, client)
        try:
            flush_backlog(settings, contexts, users=contexts)
            with celery_stack(env, settings, workers=1, concurrency=THREADS, beat=False) as procs:
                start_beat(procs, settings)

                def drained() -> bool:
                    stats: dict[str, int] = queue.stats()
                    return stats["due"] == 0 and stats["inflight"] == 0

                wait_for(drained, timeout=contexts * LLM_SECONDS + 120, interval=0.02)
                finished = time.monotonic()
        finally:
            client.close()
        with server.lock:
            first = min(server.request_times)
    return contexts / (finished - first)


def _shares(tag_of: Callable[[int], str]) -> str:
    """How many of the shards land on each of 3 masters with equal slot ranges."""
    counts = [0, 0, 0]
    for index in range(SHARDS):
        counts[key_slot(tag_of(index)) * 3 // CLUSTER_SLOTS] += 1
    return "/".join(str(c) for c in counts)


def run(env: BenchEnv) -> Result:
    count = 5_000 if env.quick else 20_000
    contexts = 150 if env.quick else 500
    try:
        cluster = LocalCluster(env.work_dir / "cluster", masters=3).start()
    except Exception as exc:
        return Result(
            "CLUSTER",
            "1 node vs 3-master cluster",
            "skipped",
            "",
            "figures only",
            None,
            note=f"cannot start a local Redis Cluster here: {type(exc).__name__}: {exc}",
        )
    try:
        knobs: dict[str, Any] = {
            "shards": SHARDS,
            "max_inflight": 10**9,
            "max_inflight_per_user": 10**9,
            "claim_batch": 100,
        }
        one_claims, one_rounds = claim_rate(env.settings(**knobs), count)
        cl_claims, cl_rounds = claim_rate(env.settings(redis_url=cluster.url, **knobs), count)
        one_e2e = extraction_rate(env, env.redis_url, contexts)
        cl_e2e = extraction_rate(env, cluster.url, contexts)
        balance = cluster.keys_per_master()
        shards_per_master = _shares(lambda i: shard_tag("memq", SHARDS, i))
        naive_per_master = _shares(lambda i: f"memq:{i}")
    finally:
        cluster.stop()
        env.flush_redis()
    shares = sorted(balance.values())
    return Result(
        key="CLUSTER",
        title=f"1 node vs 3-master cluster, {SHARDS} shards",
        measured=f"claims {cl_claims:,.0f}/s, extractions {cl_e2e:.1f}/s on the cluster",
        baseline=f"one node: claims {one_claims:,.0f}/s ({cl_claims / one_claims:.2f}x), "
        f"extractions {one_e2e:.1f}/s ({cl_e2e / one_e2e:.2f}x)",
        goal="figures only (all masters share this machine)",
        met=None,
        details=[
            f"claim: {count:,} due contexts over {SHARDS} shards; one node {one_rounds} "
            f"rounds, cluster {cl_rounds} rounds (claim_batch 100 per shard)",
            f"end to end: {contexts} contexts, 1 worker process x {THREADS} threads, "
            f"LLM {LLM_SECONDS * 1000:.0f} ms, storage in Redis, broker on the one node",
            f"shards per master: {shards_per_master} with tags chosen by slot; "
            f"{naive_per_master} with naive memq:<i> tags",
            "keys per master after the run: "
            + ", ".join(f"{n:,}" for n in shares)
            + (f" (max/min {shares[-1] / shares[0]:.2f})" if shares and shares[0] else ""),
        ],
    )
