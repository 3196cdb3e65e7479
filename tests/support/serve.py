"""Fixtures for `memq serve` tests: a key file with one key per role, and a real uvicorn server
process (`memq serve`) on a free loopback port pointed at a test's settings — per test
(``serve_for``) or shared by a module (:func:`module_server`)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.server.auth import digest
from memq.testing.celery_procs import memq_env
from memq.testing.serve_proc import ServeProcess


@dataclass(frozen=True)
class Keys:
    """Plain keys a test presents; the key file holds only their digests."""

    admin: str = "memq_test_admin_key_0123456789abcdef"
    agent: str = "memq_test_agent_key_0123456789abcdef"
    app1_agent: str = "memq_test_app1_agent_0123456789abcdef"
    app1_admin: str = "memq_test_app1_admin_0123456789abcdef"

    def file_text(self) -> str:
        entries = [
            {"name": "ops", "sha256": digest(self.admin), "scopes": ["admin"]},
            {"name": "agents", "sha256": digest(self.agent), "scopes": ["agent"]},
            {
                "name": "app1",
                "sha256": digest(self.app1_agent),
                "scopes": ["agent"],
                "user_prefix": "app1-",
            },
            {
                "name": "app1-ops",
                "sha256": digest(self.app1_admin),
                "scopes": ["admin"],
                "user_prefix": "app1-",
            },
        ]
        return json.dumps({"keys": entries})


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def write_keys(path: Path, keys: Keys | None = None) -> Path:
    """The key file of ``keys`` (the test keys by default), 0600 as memq serve expects."""
    path.write_text((keys or Keys()).file_text(), encoding="utf-8")
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def module_server(
    redis_server: RedisServer, tmp: Path, **overrides: Any
) -> Iterator[tuple[ServeProcess, MemqSettings]]:
    """One `memq serve` with the test keys for a whole module (each test uses its own users), on
    its own key prefix of the shared redis-server; ``overrides`` are settings."""
    values: dict[str, Any] = {
        "redis_url": redis_server.url,
        "key_prefix": f"t{uuid.uuid4().hex[:10]}",
        "storage_dir": tmp / "memory",
        "data_dir": tmp / "data",
        "llm_provider": "rules",
    }
    settings = MemqSettings(**{**values, **overrides})
    keys_file = write_keys(tmp / "keys.json")
    env = memq_env(settings, MEMQ_SERVE_API_KEYS_FILE=str(keys_file))
    with ServeProcess(env, tmp / "serve.log") as server:
        yield server, settings


@pytest.fixture
def api_keys(tmp_path: Path) -> tuple[Keys, Path]:
    keys = Keys()
    return keys, write_keys(tmp_path / "keys.json", keys)


@pytest.fixture
def serve_for(tmp_path: Path, api_keys: tuple[Keys, Path]) -> Iterator[Any]:
    """``serve_for(settings)`` → a started `memq serve` process with the test's key file."""
    started: list[ServeProcess] = []
    _keys, path = api_keys

    def start(settings: MemqSettings, *, keys: bool = True, **env: str) -> ServeProcess:
        extra = {"MEMQ_SERVE_API_KEYS_FILE": str(path)} if keys else {}
        extra.update(env)
        log = tmp_path / f"serve-{len(started)}.log"
        server = ServeProcess(memq_env(settings, **extra), log)
        started.append(server)
        return server.start()

    yield start
    for server in reversed(started):
        server.stop()
