"""Shared fixtures: a real redis-server on a free loopback port, per-test key prefixes, a scripted
OpenAI-compatible server, and settings that point at them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.testing.waiting import DEADLINE_SECONDS
from tests.support.openai_server import ScriptedOpenAI

# Fixtures shared by the end-to-end and reliability tests (real celery worker/beat subprocesses).
pytest_plugins = [
    "tests.support.celery_procs",
    "tests.support.scenarios",
    "tests.support.cluster",
    "tests.support.serve",
    "tests.support.inspector",
    "tests.support.memq_up",
    "tests.support.cli",
]


# Modules whose parts start a redis-server of their own: the launcher, the stack, the soak.
_STARTS_REDIS = (
    "memq.local.redis_server",
    "memq.local.redis_cluster",
    "memq.local.stack",
    "bench.soak",
)
# A test that starts processes makes several waits of up to DEADLINE_SECONDS each on a loaded
# machine: its own timeout (pyproject's 120 s is for the rest) must leave each wait its deadline,
# so a stuck wait fails with its own "timed out ... waiting for <what>" line first.
PROCESS_TEST_TIMEOUT_SECONDS = 5 * DEADLINE_SECONDS


def _needs_redis_server(item: pytest.Item) -> bool:
    """A test needs a real redis-server when it reaches the shared one through a fixture, is
    end-to-end (a real Redis broker, often `memq up` or `memq demo` starting one), or its module
    uses a part that starts one of its own."""
    if "redis_server" in getattr(item, "fixturenames", ()) or item.get_closest_marker("e2e"):
        return True
    module = getattr(item, "module", None)
    return any(
        str(getattr(value, "__module__", "")).startswith(_STARTS_REDIS)
        for value in vars(module or object).values()
        if callable(value)
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `integration` marker is derived, never hand-applied: every test that needs a real
    redis-server carries it, so `-m "not integration"` (`make fast`) runs without one. Such a
    test also gets the longer timeout of a test that starts processes, unless it names its own."""
    for item in items:
        if _needs_redis_server(item):
            item.add_marker(pytest.mark.integration)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(PROCESS_TEST_TIMEOUT_SECONDS))


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never pick up the developer's MEMQ_* or OpenAI settings."""
    for name in list(os.environ):
        if name.startswith("MEMQ_") or name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False)
    server.start(timeout_seconds=DEADLINE_SECONDS)
    yield server
    server.stop()


@pytest.fixture
def key_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def openai_server() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def make_settings(redis_server: RedisServer, key_prefix: str, tmp_path: Path) -> Any:
    """Settings for one test: its own key prefix and storage folder on the shared redis-server."""

    def build(**overrides: Any) -> MemqSettings:
        values: dict[str, Any] = {
            "redis_url": redis_server.url,
            "key_prefix": key_prefix,
            "storage_dir": tmp_path / "memory",
            "data_dir": tmp_path / "data",
            "llm_provider": "rules",
            # The production defaults (0.25 s, 0.5 s) are what an agent may wait; on a loaded
            # 2-core CI machine a live redis-server can take longer than that to answer, and a
            # test that is not about timeouts would then fail open at random. Tests of the
            # timeouts set their own.
            "producer_timeout_seconds": 5.0,
            "injector_timeout_seconds": 5.0,
        }
        values.update(overrides)
        return MemqSettings(**values)

    return build


@pytest.fixture
def settings(make_settings: Any) -> MemqSettings:
    return make_settings()  # type: ignore[no-any-return]
