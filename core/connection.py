"""The Redis connection factory: one place that turns settings into a client."""

from __future__ import annotations

import redis

from core.settings import MemqSettings


def redis_client(
    settings: MemqSettings,
    *,
    url: str | None = None,
    socket_timeout: float | None = 5.0,
    max_connections: int | None = None,
) -> redis.Redis:
    """A client with string replies.

    The pool is sized from the settings (redis-py caps a default pool at 100 connections, too few
    for a worker with many threads), and blocks briefly for a free connection instead of failing.
    """
    pool = redis.BlockingConnectionPool.from_url(
        url or settings.redis_url,
        decode_responses=True,
        max_connections=max_connections or settings.redis_max_connections,
        timeout=socket_timeout if socket_timeout is not None else 20,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        health_check_interval=30,
    )
    return redis.Redis(connection_pool=pool)
