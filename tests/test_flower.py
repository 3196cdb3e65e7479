"""Flower against the real stack: memq's tasks are visible through its HTTP API with the
configured credentials (and only with them), showing identifiers and never message content; a
dead-lettered extraction is FAILURE with its reason, a retry the queue scheduled is RETRY, and the
ticker stays out of the task list."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from memq.core.settings import MemqSettings
from memq.local.redis_server import free_port
from producer.producer import MemoryProducer
from tests.support.celery_procs import CeleryProcess, CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import stack_settings
from tests.support.waiting import wait_for
from worker.celery_app import FLOWER_MAX_TASKS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SECRET_TEXT = "my passport number is XK-449-2210"
MESSAGES = [
    {"role": "user", "content": f"I prefer short answers. By the way, {SECRET_TEXT}."},
    {"role": "assistant", "content": "Noted."},
]
AUTH = ("ops", "s3cret-pass")


def get(url: str, auth: tuple[str, str] | None) -> tuple[int, Any]:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read()
            if "json" not in response.headers.get("Content-Type", ""):
                return response.status, body.decode("utf-8", errors="replace")
            return response.status, json.loads(body or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def start_flower(
    celery_procs: CeleryProcs, env: dict[str, str], tmp_path: Path
) -> tuple[str, CeleryProcess]:
    """Flower behind basic auth, returned once it has *received events* from the worker: an
    extraction sent before that would be missing from its task list."""
    port = free_port()
    flower = CeleryProcess(
        "flower",
        [
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
            f"--basic-auth={AUTH[0]}:{AUTH[1]}",
            f"--max-tasks={FLOWER_MAX_TASKS}",
        ],
        env,
        tmp_path / "flower.log",
    )
    celery_procs.processes.append(flower)  # stopped with the others at teardown
    flower.wait_for_log("Visit me at")
    base = f"http://127.0.0.1:{port}"

    def worker_seen() -> bool:
        # Flower's own gauge, set from the worker's heartbeat events (a remote-control reply
        # would not prove that the event receiver runs).
        status, text = get(f"{base}/metrics", None)
        return status == 200 and any(
            line.startswith("flower_worker_online{") and line.endswith(" 1.0")
            for line in str(text).splitlines()
        )

    wait_for(worker_seen, interval=0.1, what="Flower receiving the worker's events")
    return base, flower


def extract_tasks(base: str) -> list[dict[str, Any]]:
    status, tasks = get(f"{base}/api/tasks?taskname=memq.extract", AUTH)
    return list(tasks.values()) if status == 200 and tasks else []


def test_flower_shows_memq_tasks_behind_basic_auth(
    make_settings: Any, celery_procs: CeleryProcs, tmp_path: Path
) -> None:
    settings: MemqSettings = make_settings(debounce_seconds=0.0, tick_seconds=0.2)
    env = memq_env(settings)
    celery_procs.start_worker(env)
    celery_procs.start_beat(env)
    base, _ = start_flower(celery_procs, env, tmp_path)

    with MemoryProducer(settings) as producer:
        assert producer.flush("thread-flower-1", "erin", "Helper", MESSAGES)

    def succeeded() -> list[dict[str, Any]]:
        return [t for t in extract_tasks(base) if t["state"] == "SUCCESS"]

    (task,) = wait_for(succeeded, interval=0.2, what="memq.extract in Flower")
    assert task["name"] == "memq.extract"
    shown = json.dumps(task)
    assert "thread=thread-flower-1" in task["args"]
    assert "user=erin" in task["args"] and "agent=helper" in task["args"]
    assert "XK-449-2210" not in shown and "passport" not in shown
    assert "prefer short answers" not in shown
    # The ticker ran all along (it dispatched the extraction) but sends no task events.
    status, ticks = get(f"{base}/api/tasks?taskname=memq.tick", AUTH)
    assert status == 200 and ticks == {}

    assert get(f"{base}/api/tasks", None)[0] == 401
    assert get(f"{base}/api/tasks", ("ops", "wrong"))[0] == 401


def test_a_retry_is_retry_and_a_dead_letter_is_failure_with_its_reason(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    tmp_path: Path,
) -> None:
    # An endpoint whose error quotes the request: its text must reach no reason Flower shows.
    echo = {"error": {"message": f"upstream failed on {SECRET_TEXT!r}", "type": "server_error"}}
    openai_server.responder = lambda request: Reply(status=500, body=echo)
    settings = stack_settings(make_settings, openai_server, max_attempts=2)
    env = memq_env(settings)
    celery_procs.start_worker(env)
    celery_procs.start_beat(env)
    base, _ = start_flower(celery_procs, env, tmp_path)

    with MemoryProducer(settings) as producer:
        assert producer.flush("thread-doomed", "fay", None, MESSAGES)

    def settled() -> dict[str, dict[str, Any]]:
        by_state = {t["state"]: t for t in extract_tasks(base)}
        return by_state if {"RETRY", "FAILURE"} <= set(by_state) else {}

    tasks = wait_for(settled, interval=0.2, what="a RETRY and a FAILURE in Flower")
    assert len(extract_tasks(base)) == 2  # the retry was the queue's: Celery sent nothing more
    failed, retried = tasks["FAILURE"], tasks["RETRY"]
    assert "ExtractionDeadLettered" in failed["exception"]
    assert "dead-lettered thread=thread-doomed user=fay" in failed["exception"]
    assert "TransientLLMError" in failed["exception"] and "500" in failed["exception"]
    assert "ExtractionRetryScheduled" in retried["exception"]
    assert "thread=thread-doomed" in retried["exception"]
    assert "passport" not in json.dumps(tasks)
    assert "passport" not in celery_procs.logs()  # the worker logs at INFO
