"""P4: throughput of 1,000 contexts through 1, 2 and 4 Celery worker processes (threads pool) with
a scripted LLM that answers in 200 ms. Baseline: the ideal rate, total threads / 0.2 s.

All contexts are flushed before beat starts, so the first tick claims them; the rate is counted
from the first LLM request to the moment the queue is empty (every context completed).
"""

from __future__ import annotations

import time
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
from memq.memory.update import NewFact, UpdateAnswer
from memq.testing.openai_server import update_text
from memq.testing.replies import Reply
from memq.testing.waiting import wait_for
from worker.queue import QueueClient

LLM_SECONDS = 0.2
THREADS_PER_PROCESS = 8


def answer(request: dict[str, Any]) -> Reply:
    fact = NewFact(content="User ships billing in Go", category="context", confidence=0.9)
    body = update_text(UpdateAnswer(new_facts=(fact,)))
    return Reply(content=body, delay_seconds=LLM_SECONDS)


def one_round(env: BenchEnv, processes: int, contexts: int) -> tuple[float, int]:
    """Contexts per second through ``processes`` workers, and the requests the LLM saw."""
    with scripted_llm(answer) as server:
        settings = llm_settings(
            env,
            server,
            tick_seconds=0.5,
            debounce_seconds=30.0,
            max_delay_seconds=300.0,
            max_inflight=contexts,
            redis_max_connections=64,
        )
        client = env.client()
        queue = QueueClient(settings, client)
        try:
            flush_backlog(settings, contexts, users=200)
            with celery_stack(
                env, settings, workers=processes, concurrency=THREADS_PER_PROCESS, beat=False
            ) as procs:
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
            calls = len(server.requests)
    return contexts / (finished - first), calls


def run(env: BenchEnv) -> Result:
    contexts = 200 if env.quick else 1000
    layouts = (1, 2) if env.quick else (1, 2, 4)
    rows: list[str] = []
    ratios: dict[int, float] = {}
    rates: dict[int, float] = {}
    for processes in layouts:
        threads = processes * THREADS_PER_PROCESS
        rate, calls = one_round(env, processes, contexts)
        ideal = threads / LLM_SECONDS
        rates[processes], ratios[processes] = rate, rate / ideal
        rows.append(
            f"{processes} proc x {THREADS_PER_PROCESS} threads = {threads}: {rate:.1f}/s of "
            f"ideal {ideal:.0f}/s ({rate / ideal:.0%}), {calls} LLM calls"
        )
    scaling = rates[layouts[-1]] / rates[1] / layouts[-1]
    worst = min(ratios.values())
    return Result(
        key="P4",
        title=f"throughput, {contexts} contexts, LLM 200 ms",
        measured=", ".join(f"{p} proc {rates[p]:.1f}/s" for p in layouts)
        + f"; scaling {layouts[-1]}p/1p per process {scaling:.0%}",
        baseline="ideal threads/0.2 s; ratios "
        + ", ".join(f"{p}p {ratios[p]:.0%}" for p in layouts),
        goal=">= 90 % of ideal, linear in processes",
        met=worst >= 0.90 and scaling >= 0.90,
        details=rows,
    )
