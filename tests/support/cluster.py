"""Fixtures for the Redis Cluster and Sentinel tests: a local 3-master cluster (shared by the
session) and, per test, settings and a client that point at it.

The cluster is built by :class:`memq.local.redis_cluster.LocalCluster` from the same
redis-server the other fixtures use; its nodes need their port and port + 10000 (the cluster
bus) free.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from memq.core.connection import RedisClient, redis_client
from memq.core.settings import MemqSettings
from memq.local.redis_cluster import LocalCluster
from memq.local.redis_server import RedisServer
from memq.testing.waiting import wait_for

CLUSTER_SHARDS = 48  # 16 per master when the tags are balanced
# Redis abandons a manual failover that has not completed in 5 s (CLUSTER_MF_TIMEOUT); a little
# more, so a request is only repeated once Redis has given it up.
MANUAL_FAILOVER_SECONDS = 6.0


def planned_failover(cluster: LocalCluster, replica: RedisServer) -> None:
    """``CLUSTER FAILOVER`` on ``replica``, returning once it is its shard's master.

    Redis gives a manual failover five seconds and then drops it for good ("Manual failover timed
    out." in the replica's log; the replica stays a replica): on a loaded machine the master's
    pause, the catch-up and the vote can take longer, and two failovers at once ask the same
    masters for their one vote of an epoch. Waiting once for the switch then waits for an event
    that will never come, so the wait asks again each time Redis has given the last request up.
    """
    asked_at = -MANUAL_FAILOVER_SECONDS

    def switched() -> bool:
        nonlocal asked_at
        if cluster.is_master(replica):
            return True
        if time.monotonic() - asked_at >= MANUAL_FAILOVER_SECONDS:
            with redis.Redis(host="127.0.0.1", port=replica.port, socket_timeout=5) as client:
                client.execute_command("CLUSTER FAILOVER")
            asked_at = time.monotonic()
        return False

    wait_for(switched, interval=0.1, what=f"the replica on port {replica.port} to take over")


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
