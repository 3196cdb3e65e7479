"""The read path before every agent turn against a Redis that accepts connections and never
answers: the turn waits at most ``injector_timeout_seconds`` once, then the back-off skips Redis
(no connection, no wait) until it ends; the agent gets empty memory and one log line per outage.
The strict read raises memq's typed error."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.runtime import Runtime

from memq.core.errors import RedisUnavailable
from memq.core.settings import MemqSettings
from memq.integrations.langchain import STATE_KEY, MemoryMiddleware
from memq.testing.hung_server import HungServer
from producer import backoff as backoff_module
from producer.injector import MemoryInjector
from storage import get_storage
from storage.document import Fact, MemoryDocument


@pytest.fixture
def hung() -> Iterator[HungServer]:
    with HungServer() as server:
        yield server


@pytest.fixture
def long_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    # A back-off longer than the test: every turn after the first failure falls inside it, so what
    # the agent pays is counted in connections the server saw, not guessed from a stopwatch.
    monkeypatch.setattr(backoff_module, "BACKOFF_MIN_SECONDS", 600.0)
    monkeypatch.setattr(backoff_module, "BACKOFF_MAX_SECONDS", 600.0)


@pytest.mark.integration
@pytest.mark.usefixtures("long_backoff")
def test_a_hung_redis_costs_the_injector_one_short_timeout_then_nothing(
    hung: HungServer, make_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings: MemqSettings = make_settings(
        redis_url=hung.url, storage="redis", injector_timeout_seconds=0.3
    )
    injector = MemoryInjector(settings)
    try:
        started = time.monotonic()
        assert injector.block("alice", query="hello") == ""
        first = time.monotonic() - started
        tried = hung.connections
        assert tried == 1 and hung.bytes_received > 0
        # Far below redis-py's default 5 s socket timeout: the short one ended the wait.
        assert first < 2.5
        for _ in range(20):
            assert injector.block("alice", query="hello") == ""
        assert hung.connections == tried  # inside the back-off: Redis not even tried
        with pytest.raises(RedisUnavailable, match="backing off"):
            injector.load("alice")
    finally:
        injector.close()
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "Redis unavailable" in lines[0].getMessage()
    assert lines[0].exc_info is None  # one line, not a traceback per turn


@pytest.mark.integration
def test_the_strict_read_raises_the_typed_error(hung: HungServer, make_settings: Any) -> None:
    settings = make_settings(redis_url=hung.url, storage="redis", injector_timeout_seconds=0.2)
    injector = MemoryInjector(settings)
    try:
        with pytest.raises(RedisUnavailable):
            injector.load("alice", "helper")
    finally:
        injector.close()


@pytest.mark.integration
def test_the_injector_reads_again_once_the_back_off_is_over(
    make_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backoff_module, "BACKOFF_MIN_SECONDS", 0.0)
    settings = make_settings(storage="redis", injector_timeout_seconds=0.2)
    get_storage(settings).save("alice", None, MemoryDocument(facts=[Fact(content="Likes tea")]))
    injector = MemoryInjector(settings)
    try:
        injector._backoff.failed()  # as after a timeout a moment ago
        assert "Likes tea" in injector.block("alice")
    finally:
        injector.close()


@pytest.mark.integration
@pytest.mark.usefixtures("long_backoff")
def test_the_langchain_middleware_fails_open_and_backs_off(
    hung: HungServer, make_settings: Any
) -> None:
    settings = make_settings(
        redis_url=hung.url,
        storage="redis",
        injector_timeout_seconds=0.2,
        producer_timeout_seconds=0.1,
    )
    memory = MemoryMiddleware(settings, agent_name="helper")
    try:
        state: Any = {"messages": [HumanMessage("hello")]}
        runtime: Runtime[Any] = Runtime(context={"user_id": "alice", "thread_id": "t"})
        for _ in range(10):
            assert memory.before_agent(state, runtime) == {STATE_KEY: ""}
        assert hung.connections == 1
    finally:
        memory.producer.close()
        memory.injector.close()
