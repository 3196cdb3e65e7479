"""Usage with cached tokens, the prompt cache key, the service tier and the bill: read from the
provider's usage by the real `openai` client, recorded in the extraction's log line, `memq stats`
and the exporter, priced by the configured table."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import redis
from prometheus_client.exposition import generate_latest

from memq.core.clock import now_ms
from memq.core.errors import TransientLLMError
from memq.core.metrics import read_snapshot, summarise
from memq.core.models import Message
from memq.core.settings import MemqSettings
from memq.operations.stats_rows import stats_rows
from memq.server.exporter import build_registry
from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.provider import FlexCapacity, PrefixCache, Provider
from memq.testing.replies import Reply, completion_body
from producer import MemoryProducer
from prompts.update_prompt import UpdatePrompt
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.prometheus import parse, value
from tests.support.scenarios import queue_idle, stack_settings, update_answer
from tests.support.waiting import wait_for
from worker.cost import CallUsage, PriceTable, prompt_cache_key
from worker.llm import OpenAIUpdateModel
from worker.queue import QueueClient

LONG = " ".join(f"word{i}" for i in range(1600))  # well past 1,024 tokens
PROMPT = UpdatePrompt(
    system=LONG, user="memory and conversation", conversation=(Message("user", "hi"),)
)
HOSTILE_IDS = ["alice@example.com", "auth0|abc", "\ud800lone", "a\u202eb\x00c", "x" * 5000]


def model_for(server: ScriptedOpenAI, **overrides: Any) -> OpenAIUpdateModel:
    values: dict[str, Any] = {
        "llm_provider": "openai",
        "llm_base_url": server.base_url,
        "llm_api_key": "sk-test",
        "llm_max_retries": 1,
    }
    values.update(overrides)
    return OpenAIUpdateModel(MemqSettings(**values), sleep=lambda seconds: None)


# --- the cache key


def test_the_cache_key_is_stable_opaque_and_per_user_and_agent() -> None:
    keys = {
        prompt_cache_key("memq", user, agent) for user in HOSTILE_IDS for agent in (None, "Bot")
    }
    assert len(keys) == 2 * len(HOSTILE_IDS)
    # Stable across calls, processes and releases: a new key would start every user's prompt
    # cache cold at the provider.
    assert (
        prompt_cache_key("memq", "alice@example.com", None)
        == "memq-6e9018206c38e6f9a883b7b15f2ffaf9"
    )
    assert prompt_cache_key("memq", "u", None) != prompt_cache_key("other", "u", None)
    for key in keys:
        assert re.fullmatch(r"memq-[0-9a-f]{32}", key)
        assert "alice" not in key and "auth0" not in key


def test_cached_tokens_are_read_from_the_usage_and_the_key_is_sent() -> None:
    server = ScriptedOpenAI(provider=Provider(cache=PrefixCache())).start()
    try:
        model = model_for(server)
        first = model.propose(PROMPT, cache_key="memq-k1")
        second = model.propose(PROMPT, cache_key="memq-k1")
        assert first.cached_tokens == 0
        assert second.cached_tokens >= 1024 and second.cached_tokens % 128 == 0
        assert second.cached_tokens <= second.prompt_tokens
        assert [r["prompt_cache_key"] for r in server.requests] == ["memq-k1", "memq-k1"]
        assert "service_tier" not in server.requests[0]  # none configured: none sent
        model_for(server, llm_prompt_cache_key=False).propose(PROMPT, cache_key="memq-k1")
        assert "prompt_cache_key" not in server.requests[-1]
    finally:
        server.stop()


@pytest.mark.parametrize("junk", ["many", -5, None, {"n": 1}, 10**30])
def test_a_junk_cached_count_is_zero_or_clamped_not_a_crash(
    openai_server: ScriptedOpenAI, junk: Any
) -> None:
    body = completion_body(Reply(content=update_answer()), "m")
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": junk}
    openai_server.script(Reply(body=body))
    answer = model_for(openai_server).propose(PROMPT)
    assert answer.cached_tokens == (10**30 if junk == 10**30 else 0)


# --- the service tier


def test_a_refused_flex_call_is_retried_then_sent_at_the_default_tier() -> None:
    server = ScriptedOpenAI(provider=Provider(flex=FlexCapacity(refuse=5))).start()
    try:
        answer = model_for(server, llm_service_tier="flex").propose(PROMPT)
        assert [r.get("service_tier") for r in server.requests] == ["flex", "flex", None]
        assert answer.attempts == 3
        with pytest.raises(TransientLLMError):
            model_for(server, llm_service_tier="flex", llm_flex_fallback=False).propose(PROMPT)
    finally:
        server.stop()


# --- the bill


def test_the_price_table_prices_cached_and_discounted_tokens() -> None:
    prices = PriceTable(1.0, 0.25, 4.0, batch_discount=0.5)
    assert prices.cost_usd(CallUsage(1_000_000, 0, 0)) == pytest.approx(1.0)
    assert prices.cost_usd(CallUsage(1_000_000, 600_000, 250_000)) == pytest.approx(
        0.4 + 0.15 + 1.0
    )
    assert prices.cost_usd(CallUsage(1_000_000, 0, 0, "flex")) == pytest.approx(0.5)
    # more cached than prompt tokens (a provider's junk) never bills below zero fresh tokens
    assert prices.cost_usd(CallUsage(100, 500, 0)) == pytest.approx(100 * 0.25 / 1e6)


def test_no_price_table_no_bill(make_settings: Any) -> None:
    assert PriceTable.from_settings(make_settings()) is None
    table = PriceTable.from_settings(make_settings(llm_price_input_per_million=2.0))
    assert table == PriceTable(2.0, 2.0, 0.0, 0.5)


# --- end to end: a worker records usage, stats and the exporter show it

PROMPT_TOKENS, CACHED_TOKENS, COMPLETION_TOKENS = 2000, 1536, 100
USERS = 3


def cached_answer(request: dict[str, Any]) -> Reply:
    body = completion_body(
        Reply(
            content=update_answer("The user keeps bees"),
            prompt_tokens=PROMPT_TOKENS,
            completion_tokens=COMPLETION_TOKENS,
        ),
        str(request.get("model")),
    )
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": CACHED_TOKENS}
    return Reply(body=body)


@pytest.mark.e2e
@pytest.mark.integration
def test_a_worker_records_cached_tokens_and_the_bill(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    redis_client: redis.Redis,
) -> None:
    openai_server.responder = cached_answer
    settings: MemqSettings = stack_settings(
        make_settings,
        openai_server,
        llm_price_input_per_million=1.0,
        llm_price_cached_input_per_million=0.5,
        llm_price_output_per_million=2.0,
    )
    worker = celery_procs.start_worker(memq_env(settings), concurrency=2)
    celery_procs.start_beat(memq_env(settings))
    queue = QueueClient(settings, redis_client)
    users = ["alice_example_com", "auth0-abc", "bob"]  # ids the producer accepts
    with MemoryProducer(settings) as producer:
        for user in users:
            turns = [
                {"role": "user", "content": "I keep bees."},
                {"role": "assistant", "content": "Nice."},
            ]
            assert producer.flush("t1", user, "Bot", turns)
    wait_for(
        lambda: (
            queue_idle(queue)
            and read_snapshot(redis_client, settings, now_ms()).metrics["billed_runs"] == USERS
        ),
        interval=0.1,
        what="every context extracted and counted",
    )
    # The key sent is the hashed one of each (user, agent): never the raw id.
    sent = [r["prompt_cache_key"] for r in openai_server.requests]
    # (agent names are case-folded: "Bot" and "bot" share one memory, and one cache key)
    expected = sorted(prompt_cache_key(settings.key_prefix, u, "bot") for u in users)
    assert sorted(sent) == expected
    assert not any("alice" in json.dumps(r.get("prompt_cache_key")) for r in openai_server.requests)

    read = read_snapshot(redis_client, settings, now_ms())
    snapshot = read.metrics
    assert (
        snapshot["prompt_tokens"],
        snapshot["cached_tokens"],
        snapshot["completion_tokens"],
    ) == (
        USERS * PROMPT_TOKENS,
        USERS * CACHED_TOKENS,
        USERS * COMPLETION_TOKENS,
    )
    one_call = (464 * 1.0 + 1536 * 0.5 + 100 * 2.0) / 1e6
    assert snapshot.cost_usd == pytest.approx(USERS * one_call)
    assert snapshot.cost_per_extraction_usd == pytest.approx(one_call)
    assert snapshot["turns_extracted"] == USERS * 2
    assert snapshot.cost_per_1000_turns_usd == pytest.approx(one_call * 1000 / 2)

    stats = summarise(read)
    rows = dict(stats_rows(stats))
    assert rows["prompt tokens: cached"] == f"{USERS * CACHED_TOKENS} (77%)"
    assert rows["LLM cost per extraction"] == f"${one_call:.6f}"

    samples = parse(generate_latest(build_registry(settings, redis_client)).decode())
    assert value(samples, "memq_cached_tokens_total") == USERS * CACHED_TOKENS
    assert value(samples, "memq_llm_cost_usd_total") == pytest.approx(USERS * one_call)

    log = worker.log_text()
    assert (
        log.count(f"cached_tokens={CACHED_TOKENS} completion_tokens={COMPLETION_TOKENS}") == USERS
    )
    assert "I keep bees" not in log
