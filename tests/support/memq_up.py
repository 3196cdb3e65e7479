"""`memq up` as a real subprocess for the stack tests: :class:`Up` (its output in a file, its
children by role), :func:`up_env` (a stack on the scripted model) and the ``ups`` fixture that
stops every `memq up` a test started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.waiting import DEADLINE_SECONDS, wait_for

MEMQ = str(Path(sys.executable).with_name("memq"))
_REDIS_LINE = re.compile(r"memq up: Redis redis://:\*\*\*@127\.0\.0\.1:(\d+)/0")


class Up:
    """One `memq up` subprocess, its combined output in a file."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as sink:
            self.process = subprocess.Popen(
                [MEMQ, "up", "--no-flower"],
                env=env,
                cwd=log.parent,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_text(self, needle: str, count: int = 1, timeout: float = DEADLINE_SECONDS) -> None:
        def seen() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"memq up exited {self.process.returncode}:\n{self.text()}")
            return self.text().count(needle) >= count

        wait_for(seen, timeout=timeout, interval=0.1, what=f"{needle!r} x{count} in memq up")

    @property
    def port(self) -> int:
        found = _REDIS_LINE.search(self.text())
        assert found, self.text()
        return int(found.group(1))

    def child(self, role: str) -> int:
        """The pid of the supervisor's child playing ``role`` (worker, beat, redis)."""
        pid = self.child_or_none(role)
        assert pid is not None, f"no {role} child of memq up"
        return pid

    def child_or_none(self, role: str) -> int | None:
        pids = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        for pid in pids.split():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:  # exited meanwhile
                continue
            if role == "redis" and b"redis-server" in argv[0]:
                return int(pid)
            if role.encode() in argv and b"celery" in argv:
                return int(pid)
        return None

    def replaced(self, role: str, old: int) -> bool:
        new = self.child_or_none(role)
        return new is not None and new != old

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = DEADLINE_SECONDS) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def up_env(tmp_path: Path, server: ScriptedOpenAI, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMQ_") and k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")
    }
    env.update(
        MEMQ_DATA_DIR=str(tmp_path / "data"),
        MEMQ_EXPORTER_PORT="0",  # any free port: these tests do not scrape it
        MEMQ_STORAGE="file",
        MEMQ_STORAGE_DIR=str(tmp_path / "memory"),
        MEMQ_LLM_PROVIDER="openai",
        MEMQ_LLM_BASE_URL=server.base_url,
        MEMQ_LLM_API_KEY="sk-scripted",
        MEMQ_LLM_MAX_RETRIES="0",
        MEMQ_LLM_TIMEOUT_SECONDS="10",
        MEMQ_TICK_SECONDS="0.2",
        MEMQ_DEBOUNCE_SECONDS="0",
        MEMQ_TOKEN_COUNTING="false",
        MEMQ_WORKER_CONCURRENCY="2",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@pytest.fixture
def ups() -> Iterator[list[Up]]:
    started: list[Up] = []
    yield started
    for up in started:
        up.stop(signal.SIGKILL if up.process.poll() is None else signal.SIGTERM)
