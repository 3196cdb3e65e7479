"""The stack's children: what runs (`memq up`'s rows), and how one is started or named in a log.

The supervisor in :mod:`memq.local.stack` decides when to start, restart and stop them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from memq.core.settings import MemqSettings
from memq.local.options import StackOptions
from memq.local.supervision import die_with_parent

CELERY_APP = "worker.app"
REDIS_CHILD = "redis"


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None
    crashes: list[float] = field(default_factory=list)  # monotonic times of recent deaths
    restart_at: float | None = None  # set while waiting out the back-off

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def plan_children(settings: MemqSettings, options: StackOptions) -> list[Child]:
    """The supervised children, in stop order (beat first: no new claims while the worker
    drains). Another child (e.g. a metrics exporter) is one more row here."""
    # --quiet: no banners, so the summary `memq up` prints stays on screen.
    from worker.celery_app import FLOWER_MAX_TASKS  # here: `memq` itself never loads Celery

    celery = [sys.executable, "-m", "celery", "-A", CELERY_APP, "--quiet"]
    level = f"--loglevel={options.loglevel}"
    flower = [
        *celery,
        "flower",
        f"--address={settings.flower_address}",
        f"--port={settings.flower_port}",
        # Ticks send no events, so this many extractions is about a day of a busy stack.
        f"--max-tasks={FLOWER_MAX_TASKS}",
    ]
    rows: list[tuple[str, bool, list[str]]] = [
        # First to stop: no new hand-offs while the worker drains; its spool goes to Redis,
        # which stops last.
        ("serve", options.serve, [sys.executable, "-m", "memq.cli", "serve"]),
        ("beat", options.beat, [*celery, "beat", level]),
        ("worker", options.worker, [*celery, "worker", level, "--without-gossip"]),
        ("flower", options.flower, flower),
        ("exporter", options.exporter, [sys.executable, "-m", "memq.cli", "exporter"]),
    ]
    return [Child(name, argv) for name, wanted, argv in rows if wanted]


def spawn(child: Child, env: Mapping[str, str], log_dir: Path | None) -> None:
    """Start ``child`` in its own session, reaping what a dead run of it left in its group."""
    if child.process is not None:
        # What the dead process left in its group (e.g. prefork pool children) goes first.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait()
    stdout: IO[bytes] | None = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        if child.log_file is None:  # a restarted child appends to its log
            child.log_file = (log_dir / f"{child.name}.log").open("ab")
        stdout = child.log_file
    child.process = subprocess.Popen(
        child.argv,
        env=env,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )


def log_hint(child: Child, log_dir: Path | None) -> str:
    if log_dir is None or child.name == REDIS_CHILD:
        return ""
    return f" (see {log_dir / (child.name + '.log')})"
