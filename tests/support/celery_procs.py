"""The ``celery_procs`` fixture; the process helpers live in :mod:`memq.testing.celery_procs`.

procs = CeleryProcs(log_dir=tmp_path)
worker = procs.start_worker(env, concurrency=4, pool="threads")  # returns once it is ready
procs.start_beat(env)
worker.kill()            # SIGKILL a worker mid-task (reliability tests)
procs.stop()             # SIGTERM, then SIGKILL after a bounded wait, for everything started
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from memq.testing.celery_procs import (
    READY_TIMEOUT_SECONDS,
    REPO_ROOT,
    STOP_TIMEOUT_SECONDS,
    CeleryProcess,
    CeleryProcs,
    memq_env,
)


@pytest.fixture
def celery_procs(tmp_path: Path) -> Iterator[CeleryProcs]:
    procs = CeleryProcs(tmp_path / "celery")
    try:
        yield procs
    finally:
        procs.stop()


__all__ = [
    "READY_TIMEOUT_SECONDS",
    "REPO_ROOT",
    "STOP_TIMEOUT_SECONDS",
    "CeleryProcess",
    "CeleryProcs",
    "celery_procs",
    "memq_env",
]
