"""P4: throughput of 1,000 contexts through 1, 2 and 4 Celery worker processes (threads pool, 8
threads each) with a scripted LLM that answers in 200 ms, against a bare Celery worker calling the
same model the same number of times at the same process and thread counts (bench/bare_celery.py):
what memq adds around each model call — its Redis round trips, the pipeline's CPU, the ticker.

memq: all contexts are flushed before beat starts, so the first tick claims them; the rate is
counted from the first LLM request to the moment the queue is empty (every context completed).
Bare: all tasks are sent before the workers start; from the first LLM request to the last task's
done mark. Then one counting run (1 process, through a counting proxy in front of Redis, not
timed) gives memq's Redis round trips per extraction, by what they carry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from importlib import resources
from typing import Any

import redis

from bench.common import (
    BenchEnv,
    Result,
    celery_stack,
    flush_backlog,
    llm_settings,
    scripted_llm,
    start_beat,
)
from bench.guard import Ratio
from bench.round_trips import CountingProxy, script_names
from memq.core.scripts import assemble
from memq.memory.update import NewFact, UpdateAnswer
from memq.testing.celery_procs import REPO_ROOT
from memq.testing.openai_server import update_text
from memq.testing.replies import Reply
from memq.testing.waiting import wait_for
from worker.queue import QueueClient

LLM_SECONDS = 0.2
THREADS_PER_PROCESS = 8
COUNTED_CONTEXTS = 100
# Where memq's scripts live: every ``.lua`` file there (fragments in includes/ are not scripts).
SCRIPT_PACKAGES = ("producer", "storage", "worker")


def answer(request: dict[str, Any]) -> Reply:
    fact = NewFact(content="User ships billing in Go", category="context", confidence=0.9)
    body = update_text(UpdateAnswer(new_facts=(fact,)))
    return Reply(content=body, delay_seconds=LLM_SECONDS)


def bare_answer(request: dict[str, Any]) -> Reply:
    return Reply(content="ok", delay_seconds=LLM_SECONDS)


def memq_round(
    env: BenchEnv, processes: int, contexts: int, redis_url: str | None = None
) -> tuple[float, int]:
    """Contexts per second through ``processes`` memq workers, and the requests the LLM saw.
    ``redis_url``: memq's data Redis seen through another address (the counting proxy); the
    broker stays on the bench's Redis itself."""
    with scripted_llm(answer) as server:
        overrides: dict[str, Any] = {}
        if redis_url is not None:
            overrides = {"redis_url": redis_url, "broker_url": env.redis_url}
        settings = llm_settings(
            env,
            server,
            tick_seconds=0.5,
            debounce_seconds=30.0,
            max_delay_seconds=300.0,
            max_inflight=contexts,
            redis_max_connections=64,
            **overrides,
        )
        client = env.client()
        queue = QueueClient(settings, client)
        try:
            # Handed over straight to Redis: the producer's calls are not the workers' to count.
            direct = settings.model_copy(update={"redis_url": env.redis_url})
            flush_backlog(direct, contexts, users=200)
            with celery_stack(
                env, settings, workers=processes, concurrency=THREADS_PER_PROCESS, beat=False
            ) as procs:
                start_beat(procs, settings)

                def drained() -> bool:
                    stats: dict[str, int] = queue.stats()
                    return stats["due"] == 0 and stats["inflight"] == 0

                wait_for(drained, timeout=contexts * LLM_SECONDS + 120, interval=0.02)
                finished = time.monotonic()
        finally:
            client.close()
        with server.lock:
            first = min(server.request_times)
            calls = len(server.requests)
    return contexts / (finished - first), calls


def bare_round(env: BenchEnv, processes: int, tasks: int) -> float:
    """Tasks per second through ``processes`` bare Celery workers calling the same model."""
    from bench.bare_celery import TASK, app

    db = 9  # its own database: the bare queue never meets memq's
    broker = env.redis_url.rsplit("/", 1)[0] + f"/{db}"
    done_key = f"bare-done-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(broker)
    client.flushdb()
    app.conf.broker_url = broker
    with app.connection_for_write() as connection:
        for index in range(tasks):
            app.send_task(TASK, args=[index], connection=connection)
    log_dir = env.work_dir / "bare-celery"
    log_dir.mkdir(parents=True, exist_ok=True)
    with scripted_llm(bare_answer) as server:
        variables = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("MEMQ_", "OPENAI_"))},
            "BARE_BROKER_URL": broker,
            "BARE_LLM_URL": server.base_url,
            "BARE_DONE_KEY": done_key,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
            ),
        }
        workers: list[subprocess.Popen[bytes]] = []
        try:
            for index in range(processes):
                log = (log_dir / f"worker-{processes}-{index}.log").open("ab")
                workers.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            *("-m", "celery", "-A", "bench.bare_celery", "worker"),
                            "--pool=threads",
                            f"--concurrency={THREADS_PER_PROCESS}",
                            "--loglevel=WARNING",
                            f"--hostname=bare-{uuid.uuid4().hex[:8]}@%h",
                            "--without-mingle",
                            "--without-gossip",
                        ],
                        cwd=REPO_ROOT,
                        env=variables,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            wait_for(
                lambda: int(client.get(done_key) or 0) >= tasks,
                timeout=tasks * LLM_SECONDS + 120,
                interval=0.02,
            )
            finished = time.monotonic()
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                try:
                    worker.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    worker.kill()
            client.flushdb()
            client.close()
        with server.lock:
            first = min(server.request_times)
    return tasks / (finished - float(first))


def counted_round_trips(env: BenchEnv) -> tuple[float, Counter[str]]:
    """memq's Redis round trips per extraction (1 process), by what each carries."""
    names = script_names(
        (f"{package}/{name}", assemble(package, name))
        for package in SCRIPT_PACKAGES
        for name in sorted(
            entry.name.removesuffix(".lua")
            for entry in resources.files(package).iterdir()
            if entry.name.endswith(".lua")
        )
    )
    port = int(env.redis_url.rsplit(":", 1)[1].split("/", 1)[0])
    with CountingProxy(port, names) as proxy:
        memq_round(env, 1, COUNTED_CONTEXTS, redis_url=proxy.url)
        total, counts = proxy.snapshot()
    return total / COUNTED_CONTEXTS, counts


def run(env: BenchEnv) -> Result:
    contexts = 200 if env.quick else 1000
    layouts = (1, 2) if env.quick else (1, 2, 4)
    rows: list[str] = []
    ratios: dict[int, float] = {}
    rates: dict[int, float] = {}
    for processes in layouts:
        threads = processes * THREADS_PER_PROCESS
        rate, calls = memq_round(env, processes, contexts)
        bare = bare_round(env, processes, contexts)
        rates[processes], ratios[processes] = rate, rate / bare
        rows.append(
            f"{processes} proc x {THREADS_PER_PROCESS} threads = {threads}: memq {rate:.1f}/s, "
            f"bare Celery {bare:.1f}/s ({rate / bare:.0%}; ideal {threads / LLM_SECONDS:.0f}/s), "
            f"{calls} LLM calls"
        )
    per_extraction, counts = counted_round_trips(env)
    rows.append(
        f"Redis round trips per extraction (memq's data Redis, 1 process, {COUNTED_CONTEXTS} "
        f"contexts, ticker included, broker apart): {per_extraction:.1f} — "
        + ", ".join(
            f"{label} {count / COUNTED_CONTEXTS:.2f}" for label, count in counts.most_common()
        )
    )
    worst = min(ratios.values())
    return Result(
        key="P4",
        title=f"throughput, {contexts} contexts, LLM 200 ms, vs a bare Celery worker",
        measured=", ".join(f"{p} proc {rates[p]:.1f}/s" for p in layouts)
        + f"; {per_extraction:.1f} Redis round trips per extraction",
        baseline="a bare Celery worker calling the same model; ratios "
        + ", ".join(f"{p}p {ratios[p]:.0%}" for p in layouts),
        goal=">= 90 % of a bare Celery worker at every process count",
        met=worst >= 0.90,
        ratios={f"{p} proc vs bare Celery": Ratio(ratios[p], "higher") for p in layouts},
        details=rows,
    )
