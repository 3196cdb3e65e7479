"""Real `celery -A worker.app worker` and `celery -A worker.app beat` subprocesses for end-to-end
and reliability tests, the benchmarks and the soak.

    procs = CeleryProcs(log_dir=tmp_path)
    worker = procs.start_worker(env, concurrency=4, pool="threads")  # returns once it is ready
    procs.start_beat(env)
    ...
    worker.kill()            # SIGKILL a worker mid-task (reliability tests)
    procs.stop()             # SIGTERM, then SIGKILL after a bounded wait, for everything started

The tests' ``celery_procs`` fixture stops them at teardown. ``env`` holds the
MEMQ_* variables (see :func:`memq_env`); the rest of the environment is inherited
except the developer's own MEMQ_* and OpenAI settings. Each process runs in its own session so
the whole group (prefork children included) is signalled, never anything we did not start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

from memq.core.settings import MemqSettings
from memq.core.settings_env import settings_env
from memq.testing.waiting import DEADLINE_SECONDS, wait_for

# The source checkout (memq is installed editable for tests and benchmarks): celery runs there so
# `-A worker.app` finds the tree under test.
REPO_ROOT = Path(__file__).resolve().parents[2]
# A worker on a loaded 2-core machine has taken more than 30 s to say "ready" (`make soak`).
READY_TIMEOUT_SECONDS = DEADLINE_SECONDS
STOP_TIMEOUT_SECONDS = 10.0


def memq_env(settings: MemqSettings, **extra: str) -> dict[str, str]:
    """The MEMQ_* variables that make a subprocess build the same settings as ``settings``: all
    of them, so no override a test made is silently lost in the child."""
    env = settings_env(settings)
    env.update(extra)
    return env


class CeleryProcess:
    """One celery subprocess with its log file."""

    def __init__(self, role: str, args: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.role = role
        self.args = list(args)
        self.env = dict(env)
        self.log_path = log_path
        full_env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("MEMQ_") and name not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")
        }
        full_env.update(env)
        full_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
        )
        full_env["PYTHONUNBUFFERED"] = "1"
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "worker.app", *args],
            cwd=REPO_ROOT,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_for_log(self, needle: str, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        def seen() -> bool:
            if not self.alive():
                code = self.process.returncode
                raise AssertionError(
                    f"celery {self.role} exited ({code}):\n{self.log_text()[-3000:]}"
                )
            return needle in self.log_text()

        wait_for(seen, timeout=timeout, interval=0.05, what=f"celery {self.role}: {needle!r}")

    def signal_group(self, sig: signal.Signals, *, even_if_exited: bool = False) -> None:
        """Signal the process group this process leads (its prefork children too)."""
        if self.alive() or even_if_exited:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def pause(self) -> None:
        """SIGSTOP the group: a worker frozen mid-task (a GC pause, a stalled VM)."""
        self.signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal_group(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL at once (a crashed host): no warm shutdown, no ack of running tasks."""
        self.signal_group(signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT_SECONDS)

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        """SIGTERM (warm shutdown), then SIGKILL if it has not exited within ``timeout``."""
        self.signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.process.wait(timeout=timeout)
        # Prefork children may outlive a killed parent for a moment; the group goes with it.
        self.signal_group(signal.SIGKILL, even_if_exited=True)
        self._log.close()


class CeleryProcs:
    """Starts and always stops the celery processes of one test."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: list[CeleryProcess] = []
        self._started = 0

    def start_worker(
        self,
        env: Mapping[str, str],
        concurrency: int = 2,
        pool: str = "threads",
        *,
        extra_args: tuple[str, ...] = (),
    ) -> CeleryProcess:
        """Start a worker and return once it consumes (its "ready." line is logged)."""
        name = f"memq-test-{uuid.uuid4().hex[:8]}@%h"
        proc = self._start(
            "worker",
            [
                "worker",
                f"--pool={pool}",
                f"--concurrency={concurrency}",
                "--loglevel=INFO",
                f"--hostname={name}",
                # No cluster chatter: mingle alone waits a second for replies at start.
                "--without-mingle",
                "--without-gossip",
                *extra_args,
            ],
            env,
        )
        proc.wait_for_log(" ready.")
        return proc

    def start_beat(self, env: Mapping[str, str]) -> CeleryProcess:
        """Start beat and return once its scheduler runs."""
        proc = self._start("beat", ["beat", "--loglevel=INFO"], env)
        proc.wait_for_log("beat: Starting")
        return proc

    def restart(self, proc: CeleryProcess) -> CeleryProcess:
        """Start a fresh process with ``proc``'s role, arguments and environment (what a
        supervisor does after a crash), in ``proc``'s place; returns once it is ready."""
        proc.stop()  # closes its log; kills prefork children a SIGKILLed parent left behind
        fresh = self._start(proc.role, proc.args, proc.env)
        self.processes.remove(fresh)
        self.processes[self.processes.index(proc)] = fresh
        fresh.wait_for_log(" ready." if proc.role == "worker" else "beat: Starting")
        return fresh

    def stop(self) -> None:
        """Stop everything started, newest first; beat before the workers it feeds."""
        errors: list[BaseException] = []
        for proc in reversed(self.processes):
            try:
                proc.stop()
            except BaseException as exc:  # keep stopping the others
                errors.append(exc)
        self.processes.clear()
        if errors:
            raise errors[0]

    def logs(self) -> str:
        return "\n".join(f"--- {p.role} {p.pid}\n{p.log_text()[-4000:]}" for p in self.processes)

    def _start(self, role: str, args: list[str], env: Mapping[str, str]) -> CeleryProcess:
        self._started += 1
        log_path = self.log_dir / f"celery-{role}-{self._started - 1}.log"
        proc = CeleryProcess(role, args, env, log_path)
        self.processes.append(proc)
        return proc


__all__ = ["CeleryProcess", "CeleryProcs", "memq_env"]
