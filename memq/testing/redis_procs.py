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

from memq.local.redis_server import RedisServer


@contextlib.contextmanager
def private_redis(
    data_dir: Path, *, appendonly: bool = True, appendfsync: str = "everysec"
) -> Iterator[RedisServer]:
    """A redis-server on a free loopback port, always stopped (and resumed first if paused)."""
    server = RedisServer(data_dir, appendonly=appendonly, appendfsync=appendfsync).start()
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


def restart_redis(server: RedisServer, *, kill: bool = False) -> None:
    """Stop (gracefully, or ``kill`` -9) and start again on the same port and data folder."""
    if kill:
        kill_redis(server)
    else:
        server.stop()
    server.start()


def pause_redis(server: RedisServer) -> None:
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGSTOP)


def resume_redis(server: RedisServer) -> None:
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)


__all__ = ["kill_redis", "pause_redis", "private_redis", "restart_redis", "resume_redis"]
