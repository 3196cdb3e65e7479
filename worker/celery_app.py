"""The Celery app factory: broker, task options, the beat schedule and the two tasks.

Tasks get their dependencies from a :class:`WorkerRuntime` built here, once per app; nothing deep
in the pipeline looks up ``current_app``. Debouncing never uses Celery's countdown/eta: deadlines
live in Redis and beat's ``memq.tick`` only sends tasks that can run now.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals
from celery.exceptions import Retry

from memq.core.clock import now_ms
from memq.core.errors import ExtractionDeadLettered, ExtractionRetryScheduled
from memq.core.settings import MemqSettings
from worker.batch_queue import BATCH_LOCK_MS
from worker.queue import Claim
from worker.runtime import WorkerRuntime
from worker.tasks import describe_args, extract
from worker.tick import dispatch_batch_work, run_tick

log = logging.getLogger("memq.worker")

EXTRACT_TASK = "memq.extract"
TICK_TASK = "memq.tick"
BATCH_TASK = "memq.batch"
# Flower's task cap for launchers to pass (`--max-tasks` or FLOWER_MAX_TASKS): ticks send no
# events, so this is a day of extractions at about two per second.
FLOWER_MAX_TASKS = 200_000

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
        # A lost broker is retried for ever (at kombu's 2, 4, 6 … 30 s steps), at start and after
        # a connection loss: a worker that gives up while Redis restarts helps nobody.
        "broker_connection_retry": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "broker_connection_timeout": 4.0,
        "broker_transport_options": {
            # Ping a pooled connection idle this long before use: a socket left over from
            # before a Redis restart is replaced instead of failing the next command.
            "health_check_interval": 10,
            "socket_connect_timeout": 5.0,
            "socket_keepalive": True,
            "retry_on_timeout": True,
        },
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        # One queue per key prefix: two memq deployments (or tests) on one broker never steal
        # each other's tasks.
        "task_default_queue": settings.key_prefix,
        # And one control and one event exchange per key prefix: with Celery's shared defaults
        # ("celery.pidbox", "celeryev") one deployment's Flower listed the other's workers and
        # tasks, and its `control shutdown` stopped them.
        "control_exchange": f"{settings.key_prefix}.celery",
        "event_exchange": f"{settings.key_prefix}.celeryev",
        # Acked when a run starts. Our claim lease and its reaper recover a context whose worker
        # died (much sooner than the broker's one-hour visibility timeout), so a late ack buys
        # nothing, and it costs a worker: kombu 5.7 crashes the consumer ("'NoneType' object has
        # no attribute 'hostname'") when it must restore unacked messages after a Redis restart.
        # Acked early, a run in flight during a restart has nothing to restore: it keeps going,
        # saves when Redis is back, and the consumer reconnects.
        "task_acks_late": False,
        # Only acks-late tasks are cancelled; set so Celery's default change can't surprise us.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_prefetch_multiplier": 1,
        # Take a message only when a pool slot is free: a message fetched but not yet started is
        # unacked, and restoring unacked messages after a Redis restart is where kombu 5.7 crashes
        # the consumer. The claim's lease recovers anything a dead worker held either way.
        "worker_disable_prefetch": True,
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
            args=[claim.context_id, claim.token],
            kwargs={},
            argsrepr=describe_args(claim.context_id),
            kwargsrepr="{}",
            # A copy that waited past its lease has been reaped and re-claimed: drop it.
            expires=settings.lease_seconds,
            retry_policy=_SEND_RETRY_POLICY,
        )

    # `version`: sent by tickers before the claim stopped reading it (a rolling upgrade's tasks
    # still in the broker); the run's start says which version it extracts.
    def extract_task(context_id: str, token: str, version: int | None = None) -> dict[str, Any]:
        result = extract(runtime, context_id, token)
        return settle_task(runtime, context_id, result)

    def send_batch() -> None:
        app.send_task(
            BATCH_TASK,
            args=[],
            kwargs={},
            # The next tick sends another: a copy that waited longer is of no use.
            expires=max(2 * settings.tick_seconds, 5.0),
            retry_policy=_SEND_RETRY_POLICY,
        )

    def batch_task() -> dict[str, Any]:
        report = runtime.batch_lane().cycle()
        return {"jobs_created": report.jobs_created, "applied": report.applied}

    def tick_task() -> dict[str, Any]:
        report = run_tick(runtime.queue, send_extract)
        if settings.llm_batch_active:
            dispatch_batch_work(runtime.batches, send_batch, now_ms())
        return {"claimed": report.claimed, "released": report.released, "full": report.full}

    # Registered by call, not decorator: celery is untyped and mypy --strict rejects that.
    # shared=False: Celery would otherwise add these closures, bound to *this* runtime, to every
    # app created later in the process (each app must get its own settings).
    app.task(name=EXTRACT_TASK, shared=False, soft_time_limit=soft_limit, time_limit=hard_limit)(
        extract_task
    )
    # A tick a second would bury the extractions in Flower: the ticker sends no task events
    # (the heartbeat in the metrics hash tells whether it runs).
    app.task(name=TICK_TASK, shared=False, acks_late=False, send_events=False)(tick_task)
    # The batch lane's gatherer and poller: HTTP to the provider, never a sleep; its shard locks
    # outlast this limit, so no two cycles settle one job at once.
    app.task(
        name=BATCH_TASK,
        shared=False,
        acks_late=False,
        soft_time_limit=BATCH_LOCK_MS / 1000 * 0.75,
        time_limit=BATCH_LOCK_MS / 1000 * 0.9,
    )(batch_task)
    # A dead letter is an expected FAILURE: shown with its reason, no error traceback logged.
    app.tasks[EXTRACT_TASK].throws = (ExtractionDeadLettered,)
    _quiet_beat(app)
    _publish_location(app, settings)
    _warm_at_start(app, settings)
    app.memq_runtime = runtime  # for tests and `memq doctor`; tasks never look it up
    return app


def settle_task(runtime: WorkerRuntime, context_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """Tell Celery the truth about a run (the run body already settled and counted it).

    A dead-lettered context raises :class:`ExtractionDeadLettered` (Celery and Flower show
    FAILURE and the reason), a retry the queue scheduled raises Celery's ``Retry`` itself — which
    marks the task RETRY and emits task-retried without Celery sending anything again (the ticker
    re-dispatches at the deadline in Redis). Anything else is a success.
    """
    queue_state = str(result.get("queue", ""))
    if result.get("outcome") != "failed" or queue_state not in ("dead", "retry"):
        return result
    reason = _last_error(runtime, context_id) or str(result.get("error", "unknown error"))
    described = f"{describe_args(context_id)}: {reason}"
    if queue_state == "dead":
        raise ExtractionDeadLettered(f"dead-lettered {described}")
    raise Retry(f"retry scheduled by the queue: {described}", ExtractionRetryScheduled(described))


def _last_error(runtime: WorkerRuntime, context_id: str) -> str:
    """The reason the queue recorded (content-free by construction); "" when unreadable."""
    try:
        return str(runtime.queue.load(context_id).get("last_error", ""))[:500]
    except Exception:  # the task's truth must not depend on one more Redis read
        return ""


def _publish_location(app: Celery, settings: MemqSettings) -> None:
    """At worker start, say in Redis where this worker stores memory documents, so readers
    configured for another place can tell (see storage.location)."""

    def on_worker_init(sender: Any, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        from memq.core.connection import redis_client
        from storage.location import publish

        # Its own short-lived client: the runtime's is built in each pool child after the fork.
        client = redis_client(settings, socket_timeout=5.0)
        try:
            log.info("memq: worker stores memory in %s", publish(client, settings).describe())
        except Exception as exc:  # the worker still works; readers just cannot compare
            log.warning("memq: could not publish the storage location: %s", type(exc).__name__)
        finally:
            client.close()

    app.memq_on_worker_init = on_worker_init
    signals.worker_init.connect(on_worker_init)


def _warm_at_start(app: Celery, settings: MemqSettings) -> None:
    """At worker start, before the pool forks or starts its threads: load the token encoding and
    the Chinese segmenter the first extraction (its prompt budget, the memory slice's ranking)
    would otherwise load inside a run."""

    def on_worker_init(sender: Any, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        from prompts.injection import warm
        from prompts.tokens import make_token_counter

        try:
            warm(make_token_counter(settings.token_counting))
        except Exception as exc:  # only the first run pays the loading then
            log.warning("memq: warming the tokenizer failed: %s", type(exc).__name__)

    app.memq_on_worker_warm = on_worker_init  # signals hold receivers weakly
    signals.worker_init.connect(on_worker_init)


def _quiet_beat(app: Celery) -> None:
    """No task-sent events from beat: its only sends are ticks. (The worker's own sends, the
    extractions, keep theirs.)"""

    conf = app.conf

    def on_beat_init(sender: Any, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            conf.task_send_sent_event = False

    # Weakly connected and kept alive by the app itself: an app dropped (tests build many) takes
    # its receiver with it.
    app.memq_on_beat_init = on_beat_init
    signals.beat_init.connect(on_beat_init)
