"""Two deployments sharing one broker with different key prefixes are two clusters to Celery:
a remote-control broadcast (what Flower and `celery inspect`/`control shutdown` send) and the
task events (what Flower lists) of one never reach the other. Real workers on a real broker."""

from __future__ import annotations

from typing import Any

import pytest

from memq.testing.celery_procs import CeleryProcs, memq_env
from memq.testing.waiting import DEADLINE_SECONDS
from worker.celery_app import celery_config, create_app

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_control_and_event_exchanges_are_named_per_key_prefix(make_settings: Any) -> None:
    a = celery_config(make_settings(key_prefix="tenant-a"))
    b = celery_config(make_settings(key_prefix="tenant-b"))
    for name in ("control_exchange", "event_exchange", "task_default_queue"):
        assert a[name] != b[name], name
        assert "tenant-a" in a[name]


def test_a_broadcast_reaches_only_the_workers_of_its_own_prefix(
    make_settings: Any, celery_procs: CeleryProcs, key_prefix: str
) -> None:
    settings_a = make_settings(key_prefix=f"{key_prefix}a")
    settings_b = make_settings(key_prefix=f"{key_prefix}b")
    worker_a = celery_procs.start_worker(memq_env(settings_a), concurrency=1)
    worker_b = celery_procs.start_worker(memq_env(settings_b), concurrency=1)
    app_a, app_b = create_app(settings_a), create_app(settings_b)
    try:
        replies_a = app_a.control.ping(timeout=2.0)
        replies_b = app_b.control.ping(timeout=2.0)
        names_a = {name for reply in replies_a for name in reply}
        names_b = {name for reply in replies_b for name in reply}
        assert len(names_a) == 1 and len(names_b) == 1, (names_a, names_b)
        assert names_a != names_b
        # One deployment's `celery control shutdown` leaves the other's worker running.
        app_a.control.shutdown(destination=None)
        worker_a.process.wait(timeout=DEADLINE_SECONDS)
        assert worker_b.alive() and app_b.control.ping(timeout=2.0)
    finally:
        app_a.close()
        app_b.close()
