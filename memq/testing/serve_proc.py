"""A real `memq serve` (uvicorn) subprocess on a free loopback port, for tests and benchmarks.

server = ServeProcess(env, log_path).start()   # returns once /healthz answers
httpx.get(server.url + "/healthz")
server.stop()                                  # SIGTERM, then SIGKILL after a bounded wait
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from memq.local.redis_server import free_port
from memq.testing.celery_procs import REPO_ROOT
from memq.testing.waiting import DEADLINE_SECONDS, wait_for

READY_TIMEOUT_SECONDS = DEADLINE_SECONDS
STOP_TIMEOUT_SECONDS = 10.0


class ServeProcess:
    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServeProcess:
        full_env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("MEMQ_") and name not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")
        }
        full_env.update(self.env)
        full_env["PYTHONUNBUFFERED"] = "1"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "memq.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *self.extra_args,
            ],
            cwd=REPO_ROOT,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_for(self._ready, timeout=READY_TIMEOUT_SECONDS, interval=0.05, what="memq serve")
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(
                f"memq serve exited ({self.process.returncode}):\n{self.log_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=1.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log_text(self) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        process = self.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=timeout)
        self.process = None

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["ServeProcess"]
