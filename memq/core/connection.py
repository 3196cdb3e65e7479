"""The Redis connection factory: one place that turns settings into a client.

Three URL forms reach three kinds of deployment, behind one client type:

* ``redis://`` / ``rediss://`` / ``unix://``: one Redis (``redis.Redis``);
* ``redis+cluster://host:port[,host:port…][/0]`` (``rediss+cluster://`` with TLS): Redis Cluster
  (``RedisCluster``; any node is enough to discover the rest);
* ``redis+sentinel://host:port[,host:port…]/master_name[/db]`` (``rediss+sentinel://`` with TLS
  to the master): the master a set of Sentinels names, rediscovered after a failover.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Final, TypeAlias

import hiredis
import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from memq.core.errors import RedisRefused, RedisUnavailable
from memq.core.redis_urls import RedisTarget, parse_redis_url
from memq.core.settings import MemqSettings

# What a failed Redis call raises: redis-py's own errors, plus RedisCluster's "no node answers"
# (RedisClusterException is not a RedisError).
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
# Unreachable rather than refusing: worth a retry or the spool.
UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    RedisClusterException,
)

# Redis answered and said no: retrying will not help until the settings change.
_AUTH_MARKERS = ("WRONGPASS", "NOAUTH", "invalid username-password", "Authentication required")


def redis_failure_summary(exc: BaseException) -> str:
    """What went wrong talking to Redis, in words a caller anywhere may read: authentication,
    permission, or unreachable (no host, no password, none of Redis's own text)."""
    text = str(exc)
    if isinstance(exc, redis.AuthenticationError) or any(m in text for m in _AUTH_MARKERS):
        return (
            "Redis refused memq's credentials (authentication failed): check the user and "
            "password in MEMQ_REDIS_URL"
        )
    if isinstance(exc, redis.exceptions.NoPermissionError) or text.startswith("NOPERM"):
        return "Redis refused a command (permission: the ACL user in MEMQ_REDIS_URL may not run it)"
    if isinstance(exc, redis.TimeoutError):
        return "Redis did not answer in time (unreachable)"
    if isinstance(exc, UNREACHABLE_ERRORS):
        return "Redis is unreachable"
    return "Redis failed"


def describe_redis_failure(exc: BaseException) -> str:
    """:func:`redis_failure_summary` with Redis's own one line (for the operator: logs, the CLI;
    redis-py's messages never carry a password)."""
    text = " ".join(str(exc).split())[:200] or type(exc).__name__
    return f"{redis_failure_summary(exc)}: {text}"


def unavailable(exc: BaseException, what: str) -> RedisUnavailable:
    """The memq error for a failed Redis call: :class:`RedisRefused` when Redis refused the
    credentials or the command, else :class:`RedisUnavailable`; the message is ``what`` and
    :func:`describe_redis_failure`, its ``summary`` the words a remote caller may read."""
    text = str(exc)
    refused = isinstance(exc, (redis.AuthenticationError, redis.exceptions.NoPermissionError))
    kind = (
        RedisRefused
        if refused or text.startswith("NOPERM") or any(m in text for m in _AUTH_MARKERS)
        else RedisUnavailable
    )
    error = kind(f"{what}: {describe_redis_failure(exc)}")
    error.summary = redis_failure_summary(exc)
    return error


# What every part of memq talks to. Both share the commands memq uses (Lua scripts included:
# each script's keys sit in one hash slot) and pipelines without MULTI.
RedisClient: TypeAlias = "redis.Redis | RedisCluster"


def _failover_retry(socket_timeout: float | None) -> Retry:
    """Workers (timeouts of seconds) retry long enough to ride out a replica promotion; a
    producer (a sub-second timeout) tries once more and then spools: it must never wait."""
    if socket_timeout is not None and socket_timeout < 1.0:
        return Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.05), retries=1)
    return Retry(ExponentialWithJitterBackoff(base=0.1, cap=2.0), retries=8)


def _retry(target: RedisTarget, socket_timeout: float | None, outage_retries: int | None) -> Retry:
    """``outage_retries`` given: that many retries of a refused or dropped connection, with
    jittered backoff (workers ride out a Redis restart of a few seconds). Not given: none on one
    Redis (a producer spools, a command fails at once), and on a cluster or behind Sentinels just
    enough to follow a failover (see :func:`_failover_retry`)."""
    if target.kind in ("cluster", "sentinel"):
        if outage_retries is None:
            return _failover_retry(socket_timeout)
        # A failover also shows as a timeout to a demoted node: redis-py's default errors.
        return Retry(ExponentialWithJitterBackoff(base=0.1, cap=2.0), max(outage_retries, 1))
    if outage_retries is None or outage_retries <= 0:
        return Retry(NoBackoff(), 0)
    return Retry(
        ExponentialWithJitterBackoff(base=0.1, cap=2.0),
        outage_retries,
        supported_errors=(redis.ConnectionError,),
    )


def redis_client(
    settings: MemqSettings,
    *,
    url: str | None = None,
    socket_timeout: float | None = 5.0,
    max_connections: int | None = None,
    outage_retries: int | None = None,
) -> RedisClient:
    """A client with string replies, for one Redis, a Redis Cluster or a Sentinel-managed master.

    The pool is sized from the settings (redis-py caps a default pool at 100 connections, too few
    for a worker with many threads), and blocks briefly for a free connection instead of failing.

    ``outage_retries`` > 0 retries a command that meets a refused or dropped connection, with
    jittered exponential back-off (0.1 s doubling to 2 s: 8 retries ride out ~5-10 s), so a
    long-running worker's run that ends while Redis restarts still settles its claim. Leave it
    unset wherever a caller must not wait (the producer in an agent, the CLI): on one Redis that
    means no retry, on a cluster or behind Sentinels just enough to follow a failover.
    """
    target = parse_redis_url(url or settings.redis_url)
    pool_size = max_connections or settings.redis_max_connections
    common: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_timeout,
        "health_check_interval": 30,
        "retry": _retry(target, socket_timeout, outage_retries),
    }
    if target.kind == "cluster":
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.hosts],  # type: ignore[no-untyped-call]
            username=target.username,
            password=target.password,
            ssl=target.tls,
            max_connections=pool_size,
            **common,
        )
    if target.kind == "sentinel":
        return _sentinel_master(target, pool_size, socket_timeout, common)
    pool = redis.BlockingConnectionPool.from_url(
        target.url,
        max_connections=pool_size,
        timeout=socket_timeout if socket_timeout is not None else 20,
        **common,
    )
    return redis.Redis(connection_pool=pool)


def _sentinel_master(
    target: RedisTarget, pool_size: int, socket_timeout: float | None, common: dict[str, Any]
) -> redis.Redis:
    sentinel = Sentinel(
        list(target.hosts),
        sentinel_kwargs={
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_timeout,
        },
    )
    assert target.master_name is not None  # parse_redis_url requires it
    # Every new connection asks the Sentinels where the master is, and a connection to a
    # demoted master fails with READONLY (redis-py then disconnects it): after a failover the
    # retries land on the promoted replica.
    master: redis.Redis = sentinel.master_for(
        target.master_name,
        connection_pool_class=SentinelConnectionPool,
        db=target.db,
        username=target.username,
        password=target.password,
        ssl=target.tls,
        max_connections=pool_size,
        **common,
    )
    return master


# What :meth:`HeldConnection.execute` answers when another thread holds the connection.
BUSY: Final = object()


class HeldConnection:
    """A connection borrowed once from a plain client's pool, for a path that sends one command
    per call on every agent turn (the producer's enqueue).

    Through the client, each call also takes a connection from the pool and gives it back (a
    lock, a liveness poll, redis-py's metrics bookkeeping) and goes through the dispatch's retry
    and observability wrappers: as much Python as the round trip's own. Here a call packs the
    command, sends it and reads the reply on the borrowed connection. Only for a client whose
    connections retry nothing (:func:`held_connection`), where the dispatch does the same: one
    try, the socket closed on a socket error (the connection does that itself, and reconnects on
    the next call). One thread at a time: :meth:`execute` answers :data:`BUSY` to a second one,
    which then goes through the client. A socket the server closed while the connection sat
    idle (a Redis restart) is noticed before the send, as the pool's checkout notices it, and
    replaced. Borrowed lazily (building a producer never connects),
    again in a forked child (the parent's socket is not the child's), and given back by
    :meth:`close`.
    """

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._connection: Any = None
        self._pid = 0

    def execute(self, args: tuple[str | int, ...]) -> Any:
        """The reply to the command ``args`` (its name first), or :data:`BUSY`. Raises what
        redis-py raises for the command (a ``ResponseError`` leaves the connection usable)."""
        if not self._lock.acquire(blocking=False):
            return BUSY
        try:
            connection = self._connection
            if connection is None or self._pid != os.getpid():
                connection = self._borrow()
            else:
                _drop_if_stale(connection)
            # hiredis's stub types the argument as a 1-tuple; it takes any length.
            packed = hiredis.pack_command(args)  # type: ignore[arg-type]
            connection.send_packed_command((packed,))
            reply = connection.read_response()
            if connection.should_reconnect():  # a maintenance notification (RESP3) asked so
                connection.disconnect()
            return reply
        finally:
            self._lock.release()

    def close(self) -> None:
        """Give the connection back to the pool (in the process that borrowed it)."""
        with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None and self._pid == os.getpid():
                self._pool.release(connection)

    def _borrow(self) -> Any:
        self._connection = None  # a forked child drops the parent's, never closes it
        connection = self._pool.get_connection()
        self._connection, self._pid = connection, os.getpid()
        return connection


def _drop_if_stale(connection: Any) -> None:
    """Disconnect an idle connection whose socket is readable before anything was sent on it:
    the server closed it (a restart, ``CLIENT KILL``, its idle timeout) or left stray bytes. The
    pool makes this check at every checkout, so a held connection makes it before every call;
    the send then opens a fresh socket. One poll of the socket, no round trip."""
    if connection._sock is None:
        return
    try:
        stale = connection.can_read()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        stale = True
    if stale:
        connection.disconnect()


def held_connection(client: RedisClient) -> HeldConnection | None:
    """A :class:`HeldConnection` on ``client``'s pool, or None where the client's own dispatch
    does more than one plain try (a cluster: routing; Sentinels: failover retries; connections
    that retry; a client-side cache), a client of one connection, and a pool of one (holding it
    would leave the others nothing)."""
    if type(client) is not redis.Redis or client.connection is not None:
        return None
    pool = client.connection_pool
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool):
        return None
    if pool.max_connections < 2:
        return None
    retry = pool.connection_kwargs.get("retry")  # absent: the connection's default, which retries
    if getattr(pool, "cache", None) is not None or retry is None or retry.get_retries():
        return None
    return HeldConnection(pool)
