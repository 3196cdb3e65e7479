"""Flower against the real stack: memq's tasks are visible through its HTTP API with the
configured credentials (and only with them), showing identifiers and never message content."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from core.settings import MemqSettings
from memq.redis_server import free_port
from producer.producer import MemoryProducer
from tests.support.celery_procs import CeleryProcess, CeleryProcs, memq_env
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SECRET_TEXT = "my passport number is XK-449-2210"
MESSAGES = [
    {"role": "user", "content": f"I prefer short answers. By the way, {SECRET_TEXT}."},
    {"role": "assistant", "content": "Noted."},
]


def get(url: str, auth: tuple[str, str] | None) -> tuple[int, Any]:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def test_flower_shows_memq_tasks_behind_basic_auth(
    make_settings: Any, celery_procs: CeleryProcs, tmp_path: Path
) -> None:
    settings: MemqSettings = make_settings(debounce_seconds=0.0, tick_seconds=0.2)
    env = memq_env(settings)
    celery_procs.start_worker(env)
    celery_procs.start_beat(env)
    port = free_port()
    flower = CeleryProcess(
        "flower",
        ["flower", f"--port={port}", "--address=127.0.0.1", "--basic-auth=ops:s3cret-pass"],
        env,
        tmp_path / "flower.log",
    )
    celery_procs.processes.append(flower)  # stopped with the others at teardown
    flower.wait_for_log("Visit me at")
    base = f"http://127.0.0.1:{port}"
    auth = ("ops", "s3cret-pass")

    with MemoryProducer(settings) as producer:
        assert producer.flush("thread-flower-1", "erin", "Helper", MESSAGES)

    def extract_tasks() -> list[dict[str, Any]]:
        status, tasks = get(f"{base}/api/tasks?taskname=memq.extract", auth)
        return list(tasks.values()) if status == 200 and tasks else []

    (task,) = wait_for(extract_tasks, timeout=30, interval=0.2, what="memq.extract in Flower")
    assert task["name"] == "memq.extract"
    shown = json.dumps(task)
    assert "thread=thread-flower-1" in task["args"]
    assert "user=erin" in task["args"] and "agent=helper" in task["args"]
    assert "XK-449-2210" not in shown and "passport" not in shown
    assert "prefer short answers" not in shown
    # The tick shows up too, under its readable name.
    status, ticks = get(f"{base}/api/tasks?taskname=memq.tick&limit=1", auth)
    assert status == 200 and ticks

    assert get(f"{base}/api/tasks", None)[0] == 401
    assert get(f"{base}/api/tasks", ("ops", "wrong"))[0] == 401
