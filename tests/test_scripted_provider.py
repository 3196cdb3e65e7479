"""The scripted server's provider behaviours, through the real `openai` client: prefix caching in
128-token steps from 1,024 per cache key and within the retention window, RPM/TPM limits with
`x-ratelimit-*` headers and 429 + Retry-After, flex refusals."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.provider import (
    FlexCapacity,
    PrefixCache,
    Provider,
    RateLimits,
    cached_tokens_for,
)
from tests.support.clock import Clock


def words(n: int, tag: str = "w") -> str:
    """Exactly ``n`` tokens for the word tokenizer below."""
    return " ".join(f"{tag}{i}" for i in range(n))


def word_tokens(text: str) -> list[int]:
    # Deterministic and countable: one token per space-separated word (role markers included).
    return [hash(w) for w in text.split(" ")]


@pytest.fixture
def clock() -> Clock:
    return Clock(1000.0)


@pytest.fixture
def served(clock: Clock) -> Iterator[tuple[ScriptedOpenAI, openai.OpenAI]]:
    provider = Provider(
        cache=PrefixCache(retention_seconds=300, clock=clock), tokenizer=word_tokens
    )
    server = ScriptedOpenAI(provider=provider).start()
    client = openai.OpenAI(api_key="k", base_url=server.base_url, max_retries=0)
    yield server, client
    client.close()
    server.stop()


def ask(client: openai.OpenAI, text: str, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": text}],
        **extra,
    )


def cached(response: Any) -> int:
    details = response.usage.prompt_tokens_details
    return int(details.cached_tokens if details else 0)


@pytest.mark.parametrize(
    ("shared", "expected"),
    [(0, 0), (1023, 0), (1024, 1024), (1151, 1024), (1152, 1152), (5000, 4992)],
)
def test_cached_tokens_come_in_128_token_steps_from_1024(shared: int, expected: int) -> None:
    assert cached_tokens_for(shared) == expected


def test_a_shared_prefix_is_cached_per_key_and_within_the_window(
    served: tuple[ScriptedOpenAI, openai.OpenAI], clock: Clock
) -> None:
    _, client = served
    static = words(1500, "s")
    first = ask(client, f"{static} {words(50, 'a')}", prompt_cache_key="u1")
    assert cached(first) == 0  # nothing seen before
    assert first.usage.prompt_tokens == 1550
    second = ask(client, f"{static} {words(50, 'b')}", prompt_cache_key="u1")
    assert cached(second) == 1408  # 1,500 shared -> 1,024 + 3 x 128
    other_key = ask(client, f"{static} {words(50, 'c')}", prompt_cache_key="u2")
    assert cached(other_key) == 0
    clock.now += 301  # past the retention window: evicted
    assert cached(ask(client, f"{static} {words(50, 'd')}", prompt_cache_key="u1")) == 0


def test_a_short_prompt_is_never_cached(served: tuple[ScriptedOpenAI, openai.OpenAI]) -> None:
    _, client = served
    text = words(1000)
    ask(client, text)
    assert cached(ask(client, text)) == 0


def test_rate_limits_send_headers_and_429_with_retry_after(clock: Clock) -> None:
    limits = RateLimits(requests_per_minute=3, tokens_per_minute=10_000, clock=clock)
    server = ScriptedOpenAI(provider=Provider(limits=limits, tokenizer=word_tokens)).start()
    client = openai.OpenAI(api_key="k", base_url=server.base_url, max_retries=0)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hello there"}]
        )
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        assert raw.headers["x-ratelimit-remaining-requests"] == "2"
        assert raw.headers["x-ratelimit-limit-tokens"] == "10000"
        assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 10_000
        ask(client, "two")
        ask(client, "three")
        with pytest.raises(openai.RateLimitError) as refused:
            ask(client, "four")
        assert refused.value.response.headers["retry-after"] == "20"  # 1 request per 20 s
        assert refused.value.response.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.value.code == "rate_limit_exceeded"
        clock.now += 20
        ask(client, "four again")  # refilled
        assert server.refusals == [429]
    finally:
        client.close()
        server.stop()


def test_flex_requests_are_refused_while_capacity_is_short() -> None:
    server = ScriptedOpenAI(provider=Provider(flex=FlexCapacity(refuse=1))).start()
    client = openai.OpenAI(api_key="k", base_url=server.base_url, max_retries=0)
    try:
        assert ask(client, "default tier is not flex").choices  # served: not a flex request
        with pytest.raises(openai.RateLimitError) as refused:
            ask(client, "x", service_tier="flex")
        assert refused.value.code == "resource_unavailable"
        assert ask(client, "x", service_tier="flex").choices
    finally:
        client.close()
        server.stop()


def test_past_about_15_requests_a_minute_per_prefix_and_key_some_overflow_uncached(
    clock: Clock,
) -> None:
    cache = PrefixCache(clock=clock)
    static = word_tokens(words(1500, "s"))
    results = []
    for n in range(30):
        clock.now += 1  # 30 requests in 30 s: twice the rate one cache machine takes
        results.append(cache.lookup_and_store("k", static + word_tokens(words(20, f"u{n}"))))
    assert all(r == 1408 for r in results[1:15])  # under the rate: one machine, all cached
    assert 0 in results[15:]  # overflowed to machines that had not seen the prefix
    assert cache.lookup_and_store("other", static) == 0  # another key routes elsewhere
