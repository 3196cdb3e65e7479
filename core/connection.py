"""The Redis connection factory: one place that turns settings into a client."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry

from core.settings import MemqSettings


def redis_client(
    settings: MemqSettings,
    *,
    url: str | None = None,
    socket_timeout: float | None = 5.0,
    max_connections: int | None = None,
    outage_retries: int = 0,
) -> redis.Redis:
    """A client with string replies.

    The pool is sized from the settings (redis-py caps a default pool at 100 connections, too few
    for a worker with many threads), and blocks briefly for a free connection instead of failing.

    ``outage_retries`` > 0 retries a command that meets a refused or dropped connection, with
    jittered exponential back-off (0.1 s doubling to 2 s: 8 retries ride out ~5-10 s), so a
    long-running worker's run that ends while Redis restarts still settles its claim. Leave it
    at 0 wherever a caller must not wait (the producer in an agent, the CLI): timeouts are never
    retried either way.
    """
    retry = (
        Retry(
            ExponentialWithJitterBackoff(base=0.1, cap=2.0),
            outage_retries,
            supported_errors=(redis.ConnectionError,),
        )
        if outage_retries > 0
        else Retry(NoBackoff(), 0)
    )
    pool = redis.BlockingConnectionPool.from_url(
        url or settings.redis_url,
        decode_responses=True,
        max_connections=max_connections or settings.redis_max_connections,
        timeout=socket_timeout if socket_timeout is not None else 20,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        health_check_interval=30,
        retry=retry,
    )
    return redis.Redis(connection_pool=pool)
