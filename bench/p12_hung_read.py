"""HUNG: the injector's read before each agent turn against a Redis that accepts connections and
never answers. The first turn waits at most ``injector_timeout_seconds``; the turns after it, inside
the back-off, do not try Redis at all. Baseline: the same read against the live bench Redis.

The HTTP door too: a real `memq serve` whose Redis hangs answers the first hand-off after one
producer timeout (the producer's own back-off is the only one: the door used to try the strict
enqueue, then the fail-open one, and wait twice), and the hand-offs after it at once (spooled)."""

from __future__ import annotations

import time

import httpx

from bench.common import BenchEnv, Result, fmt_ms, percentile
from memq.testing.celery_procs import memq_env
from memq.testing.hung_server import HungServer
from memq.testing.serve_proc import ServeProcess
from producer.injector import MemoryInjector
from storage import get_storage
from storage.document import Fact, MemoryDocument

TURNS = 50


def run(env: BenchEnv) -> Result:
    live_settings = env.settings(storage="redis")
    get_storage(live_settings).save(
        "alice", None, MemoryDocument(facts=[Fact(content=f"Likes tea {i}") for i in range(20)])
    )
    live = MemoryInjector(live_settings)
    live_samples: list[float] = []
    try:
        live.block("alice")  # warm-up
        for _ in range(TURNS):
            t0 = time.perf_counter()
            live.block("alice")
            live_samples.append(time.perf_counter() - t0)
    finally:
        live.close()
    with HungServer() as hung:
        settings = env.settings(storage="redis", redis_url=hung.url)
        timeout = settings.injector_timeout_seconds
        injector = MemoryInjector(settings)
        samples: list[float] = []
        try:
            for _ in range(TURNS):
                t0 = time.perf_counter()
                injector.block("alice")
                samples.append(time.perf_counter() - t0)
        finally:
            injector.close()
        tried = hung.connections
        door = _http_door(env, hung.url)
    first, rest = samples[0], samples[1:]
    rest_p99 = percentile(rest, 99)
    http_first, http_rest, producer_timeout = door
    http_p99 = percentile(http_rest, 99)
    return Result(
        key="HUNG",
        title="injector read before each turn, Redis hung (accepts, never answers)",
        measured=f"first turn {fmt_ms(first)}, next {len(rest)} turns p99 {fmt_ms(rest_p99)}",
        baseline=f"live Redis median {fmt_ms(percentile(live_samples, 50))}; "
        f"timeout {timeout:g} s; Redis tried {tried} time(s) in {TURNS} turns",
        goal="first turn <= timeout + 0.2 s; later turns p99 <= 1 ms; HTTP: first hand-off "
        "< 2 producer timeouts",
        met=first <= timeout + 0.2 and rest_p99 <= 0.001 and http_first < 2 * producer_timeout,
        details=[
            "before: redis-py's default 5 s socket timeout and no back-off, 3-5 s on every turn",
            f"HTTP door (`memq serve`, Redis hung): first hand-off {fmt_ms(http_first)} "
            f"({http_first / producer_timeout:.2f} x the {producer_timeout:g} s producer "
            f"timeout; two timeouts before the one back-off), next {len(http_rest)} "
            f"hand-offs p99 {fmt_ms(http_p99)} (spooled)",
        ],
    )


def _http_door(env: BenchEnv, hung_url: str) -> tuple[float, list[float], float]:
    """(first hand-off, the later ones, the producer timeout) through a real `memq serve`."""
    settings = env.settings(storage="redis", redis_url=hung_url)
    body = {
        "thread_id": "t1",
        "messages": [
            {"role": "user", "content": "I live in Lisbon."},
            {"role": "assistant", "content": "Noted."},
        ],
    }
    server = ServeProcess(memq_env(settings), env.work_dir / "hung-serve.log").start()
    samples: list[float] = []
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for _ in range(TURNS // 5):
                t0 = time.perf_counter()
                answer = http.post("/v1/users/alice/conversations", json=body)
                samples.append(time.perf_counter() - t0)
                answer.raise_for_status()
    finally:
        server.stop()
    return samples[0], samples[1:], settings.producer_timeout_seconds
