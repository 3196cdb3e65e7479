"""The Celery app factory and the lazy `worker.app` entry point (no broker needed)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

import worker
from worker.celery_app import EXTRACT_TASK, TICK_TASK, create_app


def test_the_app_has_both_tasks_and_the_reliability_options(make_settings: Any) -> None:
    settings = make_settings(tick_seconds=0.5, lease_seconds=100.0, key_prefix="memqx")
    app = create_app(settings)
    conf = app.conf

    assert {EXTRACT_TASK, TICK_TASK} <= set(app.tasks)
    assert conf.broker_url == settings.redis_url
    # Acked at start: the claim lease recovers a lost run; late acks crash kombu on a Redis restart.
    assert conf.task_acks_late is False and conf.broker_connection_max_retries is None
    assert conf.broker_transport_options["health_check_interval"] > 0
    assert conf.worker_prefetch_multiplier == 1 and conf.task_ignore_result is True
    assert conf.worker_disable_prefetch is True  # nothing unacked behind busy slots
    assert conf.worker_send_task_events and conf.task_send_sent_event  # Flower
    assert conf.task_default_queue == "memqx"
    [entry] = conf.beat_schedule.values()
    assert (entry["task"], entry["schedule"]) == (TICK_TASK, 0.5)
    assert entry["options"]["expires"] > 0  # ticks never pile up behind a busy worker
    extract = app.tasks[EXTRACT_TASK]
    # The run's budget, derived from the model timeout and retries, not from the lease: the
    # lease is renewed until the hard limit, so a slow model is never killed for being slow.
    assert extract.soft_time_limit == settings.run_budget_seconds
    assert extract.soft_time_limit >= settings.llm_timeout_seconds * (settings.llm_max_retries + 1)
    assert extract.soft_time_limit < extract.time_limit == settings.run_hard_limit_seconds
    # Flower: extractions send events, the ticker does not (it would flood the task list).
    assert extract.send_events and not app.tasks[TICK_TASK].send_events


def test_each_app_keeps_its_own_tasks(make_settings: Any) -> None:
    first = create_app(make_settings(key_prefix="one"))
    second = create_app(make_settings(key_prefix="two"))
    assert first.tasks[TICK_TASK] is not second.tasks[TICK_TASK]
    assert first.memq_runtime.settings.key_prefix == "one"
    assert second.memq_runtime.settings.key_prefix == "two"


def test_worker_app_is_built_lazily_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, redis_server: Any
) -> None:
    monkeypatch.delitem(worker.__dict__, "app", raising=False)
    monkeypatch.setenv("MEMQ_BROKER_URL", redis_server.url)
    monkeypatch.setenv("MEMQ_KEY_PREFIX", "lazyapp")
    assert "app" not in vars(sys.modules["worker"])  # importing built nothing

    app = worker.app

    assert app.conf.task_default_queue == "lazyapp"
    assert worker.app is app  # built once
    monkeypatch.delitem(worker.__dict__, "app")
    with pytest.raises(AttributeError):
        _ = worker.no_such_thing  # type: ignore[attr-defined]
