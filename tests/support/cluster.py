"""Fixtures for the Redis Cluster and Sentinel tests: a local 3-master cluster (shared by the
session) and, per test, settings and a client that point at it.

The cluster is built by :class:`memq.local.redis_cluster.LocalCluster` from the same
redis-server the other fixtures use; its nodes need their port and port + 10000 (the cluster
bus) free.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memq.core.connection import RedisClient, redis_client
from memq.core.settings import MemqSettings
from memq.local.redis_cluster import LocalCluster

CLUSTER_SHARDS = 48  # 16 per master when the tags are balanced


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), masters=3).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def make_cluster_settings(
    redis_cluster: LocalCluster, redis_server: Any, key_prefix: str, tmp_path: Path
) -> Any:
    """Settings on the cluster (data) with the broker on the plain test Redis."""

    def build(**overrides: Any) -> MemqSettings:
        values: dict[str, Any] = {
            "redis_url": redis_cluster.url,
            "broker_url": redis_server.url,
            "key_prefix": key_prefix,
            "shards": CLUSTER_SHARDS,
            "storage": "redis",
            "storage_dir": tmp_path / "memory",
            "data_dir": tmp_path / "data",
            "llm_provider": "rules",
        }
        values.update(overrides)
        return MemqSettings(**values)

    return build


@pytest.fixture
def cluster_client(make_cluster_settings: Any) -> Iterator[RedisClient]:
    client = redis_client(make_cluster_settings())
    yield client
    client.close()
