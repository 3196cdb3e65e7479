"""The local stack as one supervised foreground process: Redis, a Celery worker, beat and Flower.

`memq up` and `memq demo` use it. Children run in their own process group so that Ctrl-C reaches
only the supervisor, which then asks each to stop (SIGTERM: the worker finishes its running
extractions) and stops Redis last, so those extractions can still save. If a child dies on its
own, the whole stack stops and the supervisor reports which one: a half-running stack is worse than
a stopped one, because it looks healthy while keys pile up in `due`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any
from urllib.parse import urlsplit

from pydantic import SecretStr

from core.errors import MemqError
from core.settings import MemqSettings
from memq.redis_server import RedisServer, port_if_free

log = logging.getLogger("memq.stack")

CELERY_APP = "worker.app"


class ChildDied(MemqError, RuntimeError):
    """A process of the stack exited while the stack was meant to be running."""


def settings_env(settings: MemqSettings) -> dict[str, str]:
    """Every setting as a ``MEMQ_*`` variable, so children see exactly the supervisor's settings
    (including values passed as keyword arguments, e.g. the demo's short debounce)."""
    env: dict[str, str] = {}
    for name in type(settings).model_fields:
        value: Any = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, tuple):
            value = ",".join(value)
        elif isinstance(value, Path):
            value = str(value.resolve())
        elif isinstance(value, bool):
            value = "true" if value else "false"
        env[f"MEMQ_{name.upper()}"] = str(value)
    return env


def uses_private_redis(settings: MemqSettings) -> bool:
    """No Redis configured (environment, YAML or argument) → memq starts its own."""
    return "redis_url" not in settings.model_fields_set


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class StackOptions:
    worker: bool = True
    beat: bool = True
    flower: bool = True
    loglevel: str = "INFO"
    # None: a private redis-server only when no Redis is configured; True: always (the demo never
    # touches a configured Redis).
    private_redis: bool | None = None
    # None: children write into the terminal (memq up); a folder: one log file per child (demo).
    log_dir: Path | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)


class Stack:
    """Start with :meth:`start` (or ``with Stack(...)``), stop with :meth:`stop`; :meth:`supervise`
    blocks until a signal or a child's death."""

    def __init__(self, settings: MemqSettings, options: StackOptions | None = None) -> None:
        self.options = options or StackOptions()
        self.redis_server: RedisServer | None = None
        self.settings = settings
        self.children: list[Child] = []
        self.flower_password: str | None = None
        self._stopping = False

    # --- lifecycle
    def start(self) -> Stack:
        try:
            private = self.options.private_redis
            if private or (private is None and uses_private_redis(self.settings)):
                # On the default URL's port when it is free, so agents started with the same
                # (default) settings find this Redis without being told; else any free port.
                preferred = port_if_free(urlsplit(self.settings.redis_url).port or 6379)
                self.redis_server = RedisServer(
                    Path(self.settings.data_dir) / "redis",
                    port=preferred,
                    appendfsync=self.settings.redis_appendfsync,
                ).start()
                self.settings = self.settings.model_copy(
                    update={"redis_url": self.redis_server.url, "broker_url": None}
                )
            env = self._child_env()
            for child in self._plan():
                self._spawn(child, env)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_seconds: float = 15.0) -> None:
        """Stop children in reverse dependency order; SIGKILL whatever ignores SIGTERM."""
        self._stopping = True
        for child in self.children:  # already in beat → worker → flower order
            if child.running and child.process is not None:
                child.process.terminate()
        deadline = time.monotonic() + timeout_seconds
        for child in self.children:
            proc = child.process
            if proc is None:
                continue
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", child.name)
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
        """Raise :class:`ChildDied` when a child exited on its own."""
        for child in self.children:
            proc = child.process
            if proc is not None and proc.poll() is not None and not self._stopping:
                raise ChildDied(
                    f"{child.name} exited with code {proc.returncode}{self._log_hint(child)}"
                )

    def supervise(self, poll_seconds: float = 0.2) -> int:
        """Run until SIGINT/SIGTERM (exit 0) or a child dies (exit 1); then stop everything."""
        received: list[int] = []

        def on_signal(signum: int, frame: FrameType | None) -> None:
            received.append(signum)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not received:
                try:
                    self.check()
                except ChildDied as exc:
                    print(f"memq up: {exc}; stopping the stack", file=sys.stderr)
                    return 1
                time.sleep(poll_seconds)  # supervision poll; signals interrupt it
            return 0
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # --- details
    @property
    def redis_url(self) -> str:
        return self.settings.redis_url

    @property
    def flower_url(self) -> str:
        return f"http://{self.settings.flower_address}:{self.settings.flower_port}"

    def _plan(self) -> list[Child]:
        celery = [sys.executable, "-m", "celery", "-A", CELERY_APP]
        level = f"--loglevel={self.options.loglevel}"
        plan: list[Child] = []
        if self.options.beat:
            plan.append(Child("beat", [*celery, "beat", level]))
        if self.options.worker:
            plan.append(Child("worker", [*celery, "worker", level, "--without-gossip"]))
        if self.options.flower:
            plan.append(
                Child(
                    "flower",
                    [
                        *celery,
                        "flower",
                        f"--address={self.settings.flower_address}",
                        f"--port={self.settings.flower_port}",
                    ],
                )
            )
        return plan

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

    def _spawn(self, child: Child, env: dict[str, str]) -> None:
        stdout: IO[bytes] | None = None
        if self.options.log_dir is not None:
            self.options.log_dir.mkdir(parents=True, exist_ok=True)
            child.log_file = (self.options.log_dir / f"{child.name}.log").open("wb")
            stdout = child.log_file
        child.process = subprocess.Popen(
            child.argv,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout is not None else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.children.append(child)

    def _log_hint(self, child: Child) -> str:
        if self.options.log_dir is None:
            return ""
        return f" (see {self.options.log_dir / (child.name + '.log')})"
