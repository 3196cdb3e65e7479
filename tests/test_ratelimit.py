"""The shared LLM rate limit: the GCRA schedule in Redis (requests and tokens together, the next
free slot, a provider's pause), the headers that tighten it, that it holds across processes, and
that a worker over it sends runs back to `due` — no 429, no attempt counted."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import redis

from memq.core.clock import now_ms
from memq.core.errors import RunDeferred
from memq.core.metrics import read_snapshot
from memq.core.settings import MemqSettings
from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.provider import Provider, RateLimits
from producer import MemoryProducer
from tests.support.celery_procs import REPO_ROOT, CeleryProcs, memq_env
from tests.support.clock import T0_MS, Clock
from tests.support.scenarios import facts_of, learn_items, queue_idle, stack_settings, turn
from tests.support.waiting import wait_for
from worker.ratelimit import (
    Admission,
    RatePlan,
    SharedRateLimit,
    pause_from_headers,
    reset_seconds,
)

pytestmark = pytest.mark.integration


def limiter(
    settings: MemqSettings, client: redis.Redis, clock: Clock, **limits: Any
) -> SharedRateLimit:
    plan = RatePlan.from_settings(settings.model_copy(update=limits))
    assert plan is not None
    return SharedRateLimit(plan, client, f"{settings.key_prefix}:rate:{{t}}", clock=clock)


# --- pure parts


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1.5s", 1.5), ("1h2m", 3720.0)],
)
def test_reset_durations_are_read(text: str, seconds: float) -> None:
    assert reset_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "1s junk", "-1s", "\u202e1s", "9" * 5000 + "x"])
def test_unreadable_resets_are_none(text: str) -> None:
    assert reset_seconds(text) is None


def test_headers_tighten_the_budget_only_when_the_provider_says_so() -> None:
    assert pause_from_headers(429, {}, 7.0) == 7.0
    assert pause_from_headers(429, {}, None) == 1.0
    assert pause_from_headers(200, {"x-ratelimit-remaining-requests": "5"}, None) is None
    empty = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "6m0s",
        "x-ratelimit-limit-requests": "60",
    }
    assert pause_from_headers(200, empty, None) == pytest.approx(1.0)  # one request frees in 1 s
    hostile = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "\x00{"}
    assert pause_from_headers(200, hostile, None) is None


def test_no_limit_configured_means_no_limiter(settings: MemqSettings) -> None:
    assert RatePlan.from_settings(settings) is None


# --- the script


def wait(rate: SharedRateLimit, tokens: int = 0) -> int | None:
    """None when admitted now, else the slot it would fit at (nothing reserved)."""
    admission, at = rate.acquire(tokens)
    return None if admission is Admission.ADMITTED else at


def test_requests_fit_the_burst_then_come_at_the_rate(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    clock = Clock(T0_MS)
    # 120 per minute over 2 s with 0.2 s ticks: the provider's bucket holds 4 requests; ours
    # 2.6 (a tenth, two ticks and 100 ms less: how late a reserved run may arrive).
    rate = limiter(
        settings,
        redis_client,
        clock,
        llm_rate_limit_rpm=120.0,
        llm_rate_limit_burst_seconds=2.0,
        tick_seconds=0.2,
    )
    assert wait(rate) is None and wait(rate) is None
    assert wait(rate) == clock.now + 200  # the next slot, nothing taken
    assert wait(rate) == clock.now + 200
    clock.now += 200
    assert wait(rate) is None
    assert wait(rate) == clock.now + 500  # then one every 500 ms
    clock.now += 500
    assert wait(rate) is None


def test_a_run_that_does_not_fit_reserves_its_own_slot(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    clock = Clock(T0_MS)
    rate = limiter(settings, redis_client, clock, llm_rate_limit_rpm=60.0)  # one per second
    rate.gate_for(None)(0)  # admitted
    slots = []
    for _ in range(3):
        with pytest.raises(RunDeferred) as deferred:
            rate.gate_for(None)(0)
        slots.append(deferred.value.slot_ms)
    assert slots == [clock.now + 1000, clock.now + 2000, clock.now + 3000]  # one each
    with pytest.raises(RunDeferred) as early:  # back before its slot (a flush): wait again
        rate.gate_for(slots[0])(0)
    assert early.value.retry_at_ms == slots[0]
    clock.now = slots[1] + 300  # late: it calls without asking again
    rate.gate_for(slots[1])(0)
    assert wait(rate) == slots[2] + 1000  # the next free slot is past the reservations


def test_requests_and_tokens_are_taken_together_or_not_at_all(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    clock = Clock(T0_MS)
    rate = limiter(
        settings,
        redis_client,
        clock,
        llm_rate_limit_rpm=6000.0,
        llm_rate_limit_tpm=60_000.0,
        llm_rate_limit_burst_seconds=2.0,
        tick_seconds=0.1,
    )  # tokens: 1,000 per second, our burst 1,500
    assert wait(rate, 1200) is None
    assert wait(rate, 1200) == clock.now + 900  # the tokens do not fit yet: nothing is taken
    clock.now += 900
    assert wait(rate, 1200) is None
    # A call larger than the whole burst is charged the burst, never refused for ever.
    clock.now += 10_000
    assert wait(rate, 10**9) is None


def test_a_provider_pause_holds_everyone_and_is_never_shortened(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    clock = Clock(T0_MS)
    rate = limiter(settings, redis_client, clock, llm_rate_limit_rpm=6000.0)
    rate.observe(429, {"retry-after": "20"}, 20.0)
    rate.observe(429, {}, 1.0)  # shorter: the 20 s pause stays
    assert rate.acquire(0) == (Admission.PAUSED, clock.now + 20_000)
    with pytest.raises(RunDeferred) as paused:
        rate.gate_for(None)(0)
    assert paused.value.slot_ms is None  # a pause reserves nothing
    clock.now += 20_000
    assert wait(rate) is None


def test_redis_unreachable_admits_the_call(settings: MemqSettings) -> None:
    from memq.local.redis_server import free_port

    client = redis.Redis(port=free_port(), socket_timeout=0.5)
    rate = limiter(settings, client, Clock(T0_MS), llm_rate_limit_rpm=1.0)
    assert wait(rate) is None and wait(rate) is None


# --- across processes

_HAMMER = """
import json, sys, time
import redis
from memq.core.errors import RunDeferred
from memq.core.settings import MemqSettings
from worker.ratelimit import RatePlan, SharedRateLimit
url, key, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
plan = RatePlan.from_settings(MemqSettings(llm_rate_limit_rpm=600.0, tick_seconds=0.1))
rate = SharedRateLimit(plan, redis.Redis.from_url(url), key)
admitted, end = [], time.time() + seconds
while time.time() < end:
    if rate.acquire(0)[0].name == "ADMITTED":
        admitted.append(time.time())
print(json.dumps(admitted))
"""


def test_the_limit_holds_across_processes(settings: MemqSettings) -> None:
    key = f"{settings.key_prefix}:rate:{{procs}}"
    seconds, processes = 3.0, 4
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _HAMMER, settings.redis_url, key, str(seconds)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    times = sorted(t for p in procs for t in json.loads(p.communicate(timeout=60)[0]))
    assert all(p.returncode == 0 for p in procs)
    # Replayed through the provider's own bucket (600 per minute, enforced per second), the
    # admitted calls of all four processes together would never have met a 429 ...
    replay = Clock(T0_MS)
    provider = RateLimits(requests_per_minute=600, burst_seconds=1.0, clock=lambda: replay.now)
    for t in times:
        replay.now = t  # type: ignore[assignment]
        provider.admit(0)
    assert provider.refused == 0
    # ... and the limit is not starved: close to 10 per second all told.
    assert len(times) >= 0.9 * 10 * seconds


# --- a worker over the limit


@pytest.mark.e2e
def test_a_worker_over_the_limit_defers_runs_instead_of_meeting_429s(
    make_settings: Any,
    celery_procs: CeleryProcs,
    redis_client: redis.Redis,
) -> None:
    contexts = 8
    server = ScriptedOpenAI(
        learn_items, provider=Provider(limits=RateLimits(requests_per_minute=120, burst_seconds=1))
    ).start()
    try:
        settings: MemqSettings = stack_settings(
            make_settings,
            server,
            llm_rate_limit_rpm=120.0,
            llm_rate_limit_burst_seconds=1.0,
        )
        celery_procs.start_worker(memq_env(settings), concurrency=4)
        celery_procs.start_worker(memq_env(settings), concurrency=4)
        celery_procs.start_beat(memq_env(settings))
        with MemoryProducer(settings) as producer:
            for n in range(contexts):
                assert producer.flush(f"t{n}", f"user{n}", None, turn(f"item-{n}"))
        from worker.queue import QueueClient

        queue = QueueClient(settings, redis_client)
        wait_for(
            lambda: queue_idle(queue) and server.call_count >= contexts,
            interval=0.1,
            what="every context extracted",
        )
        assert server.refusals == []  # no 429 ever reached
        assert server.call_count == contexts
        for n in range(contexts):
            assert facts_of(settings, f"user{n}") == [f"The user owns item-{n}"]
        snapshot = read_snapshot(redis_client, settings, now_ms()).metrics
        assert snapshot.deferred.get("rate_limit", 0) > 0  # the limit did bite
        assert snapshot.extractions.get("retry", 0) == 0  # and no attempt was counted
        assert queue.stats()["dead"] == 0
        spread = server.request_times[-1] - server.request_times[0]
        assert spread >= (contexts - 2) * 0.5 * 0.9  # about 2 per second, not all at once
    finally:
        server.stop()
