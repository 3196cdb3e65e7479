"""Private redis-servers for tests, benchmarks and the soak, and the faults done to them.

A server keeps its port and data folder across a stop or a kill, so clients reconnect to the same
URL and Redis reloads its AOF, as after a restart in production.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from memq.local.redis_server import RedisServer
from memq.testing.waiting import DEADLINE_SECONDS


@contextlib.contextmanager
def private_redis(
    data_dir: Path, *, appendonly: bool = True, appendfsync: str = "everysec"
) -> Iterator[RedisServer]:
    """A redis-server on a free loopback port, always stopped (and resumed first if paused)."""
    server = RedisServer(data_dir, appendonly=appendonly, appendfsync=appendfsync)
    server.start(timeout_seconds=DEADLINE_SECONDS)
    try:
        yield server
    finally:
        resume_redis(server)
        server.stop()


def kill_redis(server: RedisServer) -> None:
    """SIGKILL: no AOF fsync, no goodbye (a crashed host). ``server.start()`` brings it back."""
    process = server.process
    if process is None:
        return
    if process.poll() is None:
        process.kill()
        process.wait()
    server.stop()  # only forgets the dead process and closes its pipe


def shutdown_redis(server: RedisServer) -> None:
    """SHUTDOWN, as an operator's `redis-cli shutdown` does: Redis fsyncs its AOF and exits.
    ``server.start()`` brings it back."""
    process = server.process
    if process is None:
        return
    # No client-side retries: redis-py would keep re-sending SHUTDOWN to a Redis that is gone.
    admin = redis.Redis(
        host="127.0.0.1",
        port=server.port,
        password=server.password,
        socket_timeout=5,
        retry=Retry(NoBackoff(), 0),
    )
    with contextlib.suppress(redis.ConnectionError):
        admin.shutdown()
    admin.close()
    process.wait(timeout=DEADLINE_SECONDS)
    server.stop()


def restart_redis(server: RedisServer, *, kill: bool = False) -> None:
    """Stop (gracefully, or ``kill`` -9) and start again on the same port and data folder."""
    if kill:
        kill_redis(server)
    else:
        server.stop()
    server.start(timeout_seconds=DEADLINE_SECONDS)


def pause_redis(server: RedisServer) -> None:
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGSTOP)


def resume_redis(server: RedisServer) -> None:
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)


__all__ = [
    "kill_redis",
    "pause_redis",
    "private_redis",
    "restart_redis",
    "resume_redis",
    "shutdown_redis",
]
