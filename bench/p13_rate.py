"""RATE: 1, 2 and 4 worker processes against a scripted provider limit of N requests per minute
(enforced per second, as providers quantize), with memq's shared rate limit set to the same N
and without it. Counted over a fixed window from the first request: successful calls per minute
against N, and the 429s the provider sent. The backlog is larger than the window can drain, so
the limit is what bounds throughput in every run.

Without the limiter each worker thread sends on its own: past the limit, 429s, inline retry
waits in worker slots, attempts counted. With it: no 429, throughput at the limit.

Throughput is counted over the window after a warm-up of WARMUP_SECONDS (the workers' first runs
load the SDK and the token encoder, and on a loaded machine the first admitted call can reach the
provider seconds late); 429s are counted over the whole run, warm-up included.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.common import BenchEnv, Result, celery_stack, flush_backlog, llm_settings, start_beat
from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.provider import Provider, RateLimits
from memq.testing.replies import Reply
from memq.testing.waiting import wait_for

N_PER_MINUTE = 120
THREADS_PER_PROCESS = 4
LLM_SECONDS = 0.05
WARMUP_SECONDS = 2.0


def answer(request: dict[str, Any]) -> Reply:
    fact = {"content": "User ships billing in Go", "category": "context", "confidence": 0.9}
    body = {"user": {}, "history": {}, "newFacts": [fact], "factsToRemove": []}
    return Reply(content=json.dumps(body), delay_seconds=LLM_SECONDS)


def one_round(env: BenchEnv, processes: int, limited: bool, window: float) -> tuple[float, int]:
    """(successful calls per minute in the window, 429s in the window)."""
    limits = RateLimits(requests_per_minute=N_PER_MINUTE, burst_seconds=1.0)
    server = ScriptedOpenAI(answer, provider=Provider(limits=limits)).start()
    contexts = int(N_PER_MINUTE * window / 60 * 2) + 20
    extra: dict[str, Any] = {}
    if limited:
        extra = {"llm_rate_limit_rpm": float(N_PER_MINUTE), "llm_rate_limit_burst_seconds": 1.0}
    settings = llm_settings(
        env,
        server,
        tick_seconds=0.2,
        debounce_seconds=30.0,
        max_delay_seconds=300.0,
        llm_max_retries=2,  # the default: a 429 is retried inline, honouring Retry-After
        retry_backoff_seconds=1.0,
        retry_backoff_max_seconds=5.0,
        **extra,
    )
    try:
        flush_backlog(settings, contexts, users=contexts)
        with celery_stack(
            env, settings, workers=processes, concurrency=THREADS_PER_PROCESS, beat=False
        ) as procs:
            start_beat(procs, settings)
            wait_for(lambda: server.call_count > 0, timeout=60, interval=0.02)
            with server.lock:
                first = server.request_times[0]
            start, end = first + WARMUP_SECONDS, first + WARMUP_SECONDS + window
            wait_for(lambda: time.monotonic() > end, timeout=window + 30, interval=0.1)
            with server.lock:
                requests = sum(1 for t in server.request_times if start < t <= end)
                refused_in = sum(1 for t in server.refusal_times if start < t <= end)
                refused = sum(1 for t in server.refusal_times if t <= end)
    finally:
        server.stop()
    return (requests - refused_in) * 60 / window, refused


def run(env: BenchEnv) -> Result:
    window = 8.0 if env.quick else 15.0
    layouts = (1, 2) if env.quick else (1, 2, 4)
    rows: list[str] = []
    headline: list[str] = []
    met = True
    for processes in layouts:
        with_rate, with_429 = one_round(env, processes, True, window)
        without_rate, without_429 = one_round(env, processes, False, window)
        met = met and with_429 == 0 and with_rate >= 0.9 * N_PER_MINUTE
        headline.append(f"{processes}p {with_rate:.0f}/min, {with_429} 429s")
        rows.append(
            f"{processes} proc x {THREADS_PER_PROCESS} threads: with the limiter "
            f"{with_rate:.0f}/min ({with_rate / N_PER_MINUTE:.0%} of N), {with_429} 429s; "
            f"without {without_rate:.0f}/min ({without_rate / N_PER_MINUTE:.0%}), "
            f"{without_429} 429s"
        )
    return Result(
        key="RATE",
        title=f"shared rate limit, N = {N_PER_MINUTE}/min, {window:.0f} s window after "
        f"{WARMUP_SECONDS:.0f} s warm-up",
        measured="with the limiter: " + "; ".join(headline),
        baseline="the same workers without the limiter (429s and throughput in the details)",
        goal="with the limiter: 0 429s and >= 90 % of N at every process count",
        met=met,
        details=rows,
    )
