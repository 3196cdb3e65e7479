"""The local stack as one supervised foreground process: Redis, a Celery worker, beat and Flower.

`memq up` and `memq demo` use it. Each child is watched: one that dies is restarted after a
back-off that doubles with each recent crash, with one line on stderr; only a child that keeps
crashing (more than ``RestartPolicy.max_crashes`` within its window) stops the whole stack, with
a non-zero exit. Celery workers ride out a Redis restart on their own; when kombu cannot (see
docs/reliability.md) the worker exits non-zero and is restarted here like any crash.

Every child, the private Redis included, runs in its own session: Ctrl-C reaches only the
supervisor, which asks beat, the worker and Flower to stop (SIGTERM: the worker finishes its
running extractions), waits for them, and stops Redis last so those extractions can still save.
A second Ctrl-C stops at once. Linux kills the children if the supervisor itself is killed.

The private Redis requires a password generated once per data folder (a 0600 file); children get
it in ``MEMQ_REDIS_URL`` through the environment, never argv. The data folder is 0700 and locked
(flock) so that a second stack cannot start a second Redis on the same AOF.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from urllib.parse import urlsplit

from memq.core.errors import MemqError
from memq.core.settings import MemqSettings
from memq.core.settings_env import settings_env
from memq.local.children import REDIS_CHILD, Child, log_hint, plan_children, spawn
from memq.local.options import StackOptions
from memq.local.redis_server import (
    WORKER_USER,
    AclUser,
    RedisServer,
    agent_rules,
    check_reachable,
    free_port,
    maxmemory_bytes_for,
    port_if_free,
    private_dir,
    redis_password,
    write_private,
)
from memq.local.supervision import DataDirLock, restart_delay


class ChildDied(MemqError, RuntimeError):
    """A process of the stack kept crashing; the stack gave up."""


def uses_private_redis(settings: MemqSettings) -> bool:
    """No Redis configured (environment, YAML or argument) → memq starts its own."""
    return "redis_url" not in settings.model_fields_set


class PortTaken(MemqError, OSError):
    """The private Redis's remembered port is held by another process."""


class Stack:
    """Start with :meth:`start` (or ``with Stack(...)``), stop with :meth:`stop`; :meth:`supervise`
    blocks until a signal, restarting children that die, or until one keeps crashing."""

    def __init__(
        self,
        settings: MemqSettings,
        options: StackOptions | None = None,
        *,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.options = options or StackOptions()
        self.redis_server: RedisServer | None = None
        self.settings = settings
        self.children: list[Child] = []
        self.flower_password: str | None = None
        self.redis_password_file: Path | None = None
        self._redis_watch = Child(REDIS_CHILD, [])
        self._lock = DataDirLock(Path(settings.data_dir))
        self._env: dict[str, str] = {}
        self._stopping = False
        self._hurry = False
        self._say = say or _stderr

    # --- lifecycle
    def start(self) -> Stack:
        try:
            private = self.options.private_redis
            private = private or (private is None and uses_private_redis(self.settings))
            if not private:
                check_reachable(self.settings.redis_url)
            private_dir(Path(self.settings.data_dir))
            self._lock.acquire()
            if private:
                self._start_private_redis()
            self._env = self._child_env()
            for child in self._plan():
                self._spawn(child)
                self.children.append(child)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_seconds: float | None = None) -> None:
        """Stop children (SIGTERM, then SIGKILL past the timeout or on a second Ctrl-C), then
        Redis, then release the data folder."""
        self._stopping = True
        if timeout_seconds is None:
            timeout_seconds = self._stop_timeout()
        for child in self.children:  # already in serve → beat → worker → flower order
            if child.running and child.process is not None:
                child.process.terminate()
        deadline = time.monotonic() + timeout_seconds
        for child in self.children:
            proc = child.process
            if proc is None:
                continue
            while proc.poll() is None and time.monotonic() < deadline and not self._hurry:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.1)
            if proc.poll() is None:
                self._say(f"memq up: {child.name} did not stop in time; killing it")
            # The group goes too: prefork children can outlive a parent that died or was killed.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if child.log_file is not None:
                child.log_file.close()
                child.log_file = None
        if self.redis_server is not None:
            self.redis_server.stop()
            self.redis_server = None
        self._lock.release()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def check(self) -> None:
        """One supervision round: restart what died once its back-off has passed; raise
        :class:`ChildDied` when one crashed too often within the policy's window."""
        if self._stopping:
            return
        now = time.monotonic()
        if self.redis_server is not None:
            self._watch(self._redis_watch, self.redis_server.process, now, self._restart_redis)
        for child in self.children:
            self._watch(child, child.process, now, functools.partial(self._spawn, child))

    def supervise(self, poll_seconds: float = 0.2) -> int:
        """Run until SIGINT/SIGTERM (exit 0) or a child keeps crashing (exit 1); then stop."""
        received: list[int] = []

        def on_signal(signum: int, frame: FrameType | None) -> None:
            received.append(signum)
            if self._stopping:
                self._hurry = True  # a second Ctrl-C: no more waiting for running extractions

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not received:
                try:
                    self.check()
                except ChildDied as exc:
                    self._say(f"memq up: {exc}; stopping the stack")
                    return 1
                time.sleep(poll_seconds)  # supervision poll; signals interrupt it
            self._say("memq up: stopping (waiting for running extractions; Ctrl-C again to hurry)")
            return 0
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # --- supervision
    def _watch(
        self,
        child: Child,
        process: subprocess.Popen[bytes] | None,
        now: float,
        restart: Callable[[], None],
    ) -> None:
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restart_at = None
                try:
                    restart()
                except MemqError as exc:  # e.g. Redis could not start: counts as another crash
                    self._crashed(child, now, f"could not restart ({exc})")
            return
        if process is None or process.poll() is None:
            return
        self._crashed(child, now, f"exited with code {process.returncode}")

    def _crashed(self, child: Child, now: float, what: str) -> None:
        window = self.options.restart.window_seconds
        child.crashes = [at for at in child.crashes if now - at <= window] + [now]
        delay = restart_delay(child.crashes, now, self.options.restart)
        if delay is None:
            raise ChildDied(
                f"{child.name} {what}; {len(child.crashes)} crashes within {window:.0f} s"
                f"{self._log_hint(child)}"
            )
        self._say(
            f"memq up: {child.name} {what}; restarting in {delay:.1f} s{self._log_hint(child)}"
        )
        child.restart_at = now + delay

    def _restart_redis(self) -> None:
        if self.redis_server is not None:
            self.redis_server.stop()  # reap the dead process, close its pipe
            self.redis_server.start()

    def _stop_timeout(self) -> float:
        """Long enough for a running extraction to finish its LLM calls and save."""
        calls = self.settings.llm_max_retries + 1
        return max(15.0, self.settings.llm_timeout_seconds * calls + 5.0)

    def _start_private_redis(self) -> None:
        """Agents log in as Redis's default user, with the password they were always given, now
        limited to memq's keys and non-admin commands; the children log in as the worker user,
        whose password only they get (through the environment)."""
        redis_dir = Path(self.settings.data_dir) / "redis"
        password = redis_password(redis_dir)
        self.redis_password_file = (redis_dir / "password").resolve()
        worker = AclUser(WORKER_USER, redis_password(redis_dir, "worker-password"), "~* &* +@all")
        self.redis_server = RedisServer(
            redis_dir,
            port=self._private_port(redis_dir),
            password=password,
            default_rules=agent_rules(self.settings.key_prefix),
            acl_users=[worker],
            appendfsync=self.settings.redis_appendfsync,
            stop_with_parent=True,
            maxmemory_bytes=maxmemory_bytes_for(self.settings.redis_maxmemory_mb),
        ).start()
        self.settings = self.settings.model_copy(
            update={"redis_url": self.redis_server.url_for(worker), "broker_url": None}
        )

    def _private_port(self, redis_dir: Path) -> int:
        """The port this data folder's Redis had last time (agents were told it), else the
        default URL's port (default-configured agents look there), else any free port.

        A remembered port held by another process is refused, never swapped for a free one:
        agents still configured with it would send their password and conversations to
        whatever listens there now."""
        remembered = redis_dir / "port"
        last = _last_port(remembered)
        if last is not None and not port_if_free(last):
            raise PortTaken(
                f"port {last}, which agents of this data folder were given, is in use by another "
                f"process on 127.0.0.1; stop it, or delete {remembered} to pick a new port and "
                "give agents the new URL"
            )
        for candidate in (last, urlsplit(self.settings.redis_url).port or 6379):
            if candidate is not None and port_if_free(candidate):
                port = candidate
                break
        else:
            port = free_port()
        write_private(redis_dir / "port", f"{port}\n")
        return port

    # --- details
    @property
    def redis_url(self) -> str:
        """The URL the stack's own processes use (the worker user of a private Redis)."""
        return self.settings.redis_url

    @property
    def agent_url(self) -> str:
        """The URL to give agents: the private Redis's limited default user, else the
        configured Redis."""
        return self.redis_server.url if self.redis_server is not None else self.redis_url

    @property
    def flower_url(self) -> str:
        return f"http://{self.settings.flower_address}:{self.settings.flower_port}"

    def _plan(self) -> list[Child]:
        return plan_children(self.settings, self.options)

    def _spawn(self, child: Child) -> None:
        spawn(child, self._env, self.options.log_dir)

    def _log_hint(self, child: Child) -> str:
        return log_hint(child, self.options.log_dir)

    def _child_env(self) -> dict[str, str]:
        # Inherited MEMQ_* variables are replaced, not merged: a stale MEMQ_BROKER_URL must not
        # survive when the supervisor chose a private Redis.
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
        env.update(settings_env(self.settings))
        env.update(self.options.extra_env)
        if self.options.flower:
            password = self.settings.flower_password
            self.flower_password = (
                password.get_secret_value() if password else secrets.token_urlsafe(12)
            )
            # Through the environment, not argv: argv is readable by every local user via `ps`.
            env["FLOWER_BASIC_AUTH"] = f"{self.settings.flower_user}:{self.flower_password}"
        return env


def _last_port(path: Path) -> int | None:
    try:
        port = int(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
