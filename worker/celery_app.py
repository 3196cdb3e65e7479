"""The Celery app factory: broker, task options, the beat schedule and the two tasks.

Tasks get their dependencies from a :class:`WorkerRuntime` built here, once per app; nothing deep
in the pipeline looks up ``current_app``. Debouncing never uses Celery's countdown/eta: deadlines
live in Redis and beat's ``memq.tick`` only sends tasks that can run now.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from core.settings import MemqSettings
from worker.queue import Claim
from worker.tasks import WorkerRuntime, describe_args, extract
from worker.tick import run_tick

EXTRACT_TASK = "memq.extract"
TICK_TASK = "memq.tick"

# A send that fails is released and retried by the next tick; don't block a tick on it.
_SEND_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.1,
    "interval_max": 0.2,
}


def celery_config(settings: MemqSettings) -> dict[str, Any]:
    """Celery settings derived from ours (a pure function, so it is testable without a broker)."""
    tick_expires = max(2 * settings.tick_seconds, 1.0)
    config: dict[str, Any] = {
        "broker_connection_retry_on_startup": True,
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        # One queue per key prefix: two memq deployments (or tests) on one broker never steal
        # each other's tasks.
        "task_default_queue": settings.key_prefix,
        # A task whose worker dies is redelivered (after the visibility timeout); our lease and
        # reaper recover the key much sooner, and the late copy finds its token stale.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_prefetch_multiplier": 1,
        "worker_concurrency": settings.worker_concurrency,
        # Flower needs both.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "enable_utc": True,
        "timezone": "UTC",
        # The schedule is static configuration: beat needs no shelve file in the working dir.
        "beat_scheduler": "celery.beat:Scheduler",
        "beat_schedule": {
            "memq-tick": {
                "task": TICK_TASK,
                "schedule": settings.tick_seconds,
                "options": {"expires": tick_expires},
            }
        },
    }
    _add_broker(config, settings)
    return config


# --- the broker (Redis Cluster / Sentinel deployments) -------------------------------------------
def _add_broker(config: dict[str, Any], settings: MemqSettings) -> None:
    """The broker URL and, for a Sentinel-managed broker, its master name (merged into any other
    transport options the config already holds).

    kombu has no Redis Cluster transport: a cluster data Redis needs MEMQ_BROKER_URL set to a plain
    or sentinel:// Redis, and this raises ConfigError (one line) when it is not."""
    broker = settings.broker
    config["broker_url"] = broker.url
    if broker.transport_options:
        options = dict(config.get("broker_transport_options") or {})
        options.update(broker.transport_options)
        config["broker_transport_options"] = options


def create_app(settings: MemqSettings) -> Celery:
    """Build the memq Celery app; the settings are the only input."""
    app = Celery("memq")
    app.conf.update(celery_config(settings))
    runtime = WorkerRuntime(settings)
    # The run's time budget: the lease is renewed until the hard limit has passed, so the prefork
    # pool stops a run before its claim can expire, and never while it is still renewable.
    soft_limit = settings.run_budget_seconds
    hard_limit = settings.run_hard_limit_seconds

    def send_extract(claim: Claim) -> None:
        app.send_task(
            EXTRACT_TASK,
            args=[claim.context_id, claim.token, claim.version],
            kwargs={},
            argsrepr=describe_args(claim.context_id, claim.version),
            kwargsrepr="{}",
            # A copy that waited past its lease has been reaped and re-claimed: drop it.
            expires=settings.lease_seconds,
            retry_policy=_SEND_RETRY_POLICY,
        )

    def extract_task(context_id: str, token: str, version: int) -> dict[str, Any]:
        return extract(runtime, context_id, token, version)

    def tick_task() -> dict[str, Any]:
        report = run_tick(runtime.queue, send_extract)
        return {"claimed": report.claimed, "released": report.released, "full": report.full}

    # Registered by call, not decorator: celery is untyped and mypy --strict rejects that.
    # shared=False: Celery would otherwise add these closures, bound to *this* runtime, to every
    # app created later in the process (each app must get its own settings).
    app.task(name=EXTRACT_TASK, shared=False, soft_time_limit=soft_limit, time_limit=hard_limit)(
        extract_task
    )
    app.task(name=TICK_TASK, shared=False, acks_late=False)(tick_task)
    app.memq_runtime = runtime  # for tests and `memq doctor`; tasks never look it up
    return app
