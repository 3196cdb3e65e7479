"""HUNG: the injector's read before each agent turn against a Redis that accepts connections and
never answers. The first turn waits at most ``injector_timeout_seconds``; the turns after it, inside
the back-off, do not try Redis at all. Baseline: the same read against the live bench Redis."""

from __future__ import annotations

import time

from bench.common import BenchEnv, Result, fmt_ms, percentile
from memq.testing.hung_server import HungServer
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
    first, rest = samples[0], samples[1:]
    rest_p99 = percentile(rest, 99)
    return Result(
        key="HUNG",
        title="injector read before each turn, Redis hung (accepts, never answers)",
        measured=f"first turn {fmt_ms(first)}, next {len(rest)} turns p99 {fmt_ms(rest_p99)}",
        baseline=f"live Redis median {fmt_ms(percentile(live_samples, 50))}; "
        f"timeout {timeout:g} s; Redis tried {tried} time(s) in {TURNS} turns",
        goal="first turn <= timeout + 0.2 s; later turns p99 <= 1 ms",
        met=first <= timeout + 0.2 and rest_p99 <= 0.001,
        details=[
            "before: redis-py's default 5 s socket timeout and no back-off, 3-5 s on every turn",
        ],
    )
