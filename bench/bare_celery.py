"""P4's baseline: a bare Celery worker calling the same model — no memq, nothing but the task.

``celery -A bench.bare_celery worker --pool threads -c 8`` with ``BARE_BROKER_URL`` (the bench's
Redis), ``BARE_LLM_URL`` (the scripted OpenAI-compatible server) and ``BARE_DONE_KEY`` (a counter
each task adds one to when its call returned, so the bench knows when all are done). Each task
makes the chat completion a memq extraction makes, with a prompt of the same size, through the
same ``openai`` client, with Celery's defaults otherwise (one message prefetched per slot).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import redis
from celery import Celery

TASK = "bare.call_model"
PROMPT_CHARS = 15_000  # about what memq's update prompt weighs in P4 (~3,900 tokens)

app = Celery("bare", broker=os.environ.get("BARE_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_local = threading.local()


def _clients() -> tuple[Any, redis.Redis]:
    """One OpenAI client and one Redis client per worker thread, built on its first task."""
    if not hasattr(_local, "llm"):
        import openai

        _local.llm = openai.OpenAI(
            base_url=os.environ["BARE_LLM_URL"], api_key="sk-bench", max_retries=0, timeout=10.0
        )
        _local.redis = redis.Redis.from_url(os.environ["BARE_BROKER_URL"])
    return _local.llm, _local.redis


@app.task(name=TASK)  # type: ignore[untyped-decorator]
def call_model(index: int) -> int:
    llm, done = _clients()
    llm.chat.completions.create(
        model="gpt-4.1-mini",
        messages=[
            {"role": "system", "content": "x" * PROMPT_CHARS},
            {"role": "user", "content": f"Context {index}: I ship billing in Go."},
        ],
    )
    done.incr(os.environ["BARE_DONE_KEY"])
    return index
