"""P3: flush latency, from ``MemoryProducer.flush()`` to the LLM request arriving at the scripted
server, through a real Celery beat (tick) and worker. Baseline: the tick period, which bounds the
wait for the next claim (0 … tick, tick/2 on average)."""

from __future__ import annotations

import random
import time

from bench.common import BenchEnv, Result, celery_stack, llm_settings, percentile, scripted_llm
from memq.testing.waiting import wait_for
from producer.producer import MemoryProducer

TICK_SECONDS = 1.0


def turn(index: int) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Flush {index}: I am moving the billing service to Go."},
        {"role": "assistant", "content": "Noted: a Go rewrite of billing. Anything else?"},
    ]


def run(env: BenchEnv) -> Result:
    flushes = 8 if env.quick else 30
    latencies: list[float] = []
    rng = random.Random(7)
    with scripted_llm() as server:
        settings = llm_settings(
            env, server, tick_seconds=TICK_SECONDS, debounce_seconds=30.0, max_delay_seconds=300.0
        )
        with celery_stack(env, settings, concurrency=4), MemoryProducer(settings) as producer:
            for index in range(flushes + 1):
                # A random phase against beat's tick, as flushes come in real life.
                time.sleep(rng.uniform(0, TICK_SECONDS))
                seen = server.call_count
                started = time.monotonic()
                if not producer.flush(f"flush-{index}", "alice", None, turn(index)):
                    raise RuntimeError("flush was not enqueued")
                wait_for(
                    lambda: server.call_count > seen,  # noqa: B023 - called in this iteration
                    timeout=30,
                    what="the LLM request",
                )
                with server.lock:
                    arrived = server.request_times[seen]
                if index:  # the first run builds the worker's LLM client and loads tiktoken
                    latencies.append(arrived - started)
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    goal = TICK_SECONDS + 0.5
    return Result(
        key="P3",
        title="flush → LLM request (real beat + worker)",
        measured=f"p50 {p50:.3f} s, p99 {p99:.3f} s, max {max(latencies):.3f} s",
        baseline=f"tick {TICK_SECONDS:.1f} s (mean wait {TICK_SECONDS / 2:.1f} s); "
        f"p99 / (tick + 0.5 s) = {p99 / goal:.2f}",
        goal="p99 <= tick + 0.5 s",
        met=p99 <= goal,
        details=[f"{len(latencies)} flushes at random tick phases, worker threads pool x4"],
    )
