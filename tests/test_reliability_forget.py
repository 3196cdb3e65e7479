"""`memq forget` sticks: with pending, in-flight and dead-lettered work for the user, and a real
worker in the middle of that user's extraction, the memory is not re-created and no key in Redis
holds the user's text afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from memq.testing.redis_dump import dump_redis
from memq.testing.waiting import DEADLINE_SECONDS, wait_for
from storage import get_storage
from tests.support.celery_procs import REPO_ROOT, CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import facts_of, learn_items, queue_idle, stack_settings, turn
from worker.queue import QueueClient

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.integration]


def test_forget_with_work_in_flight_is_not_undone_by_the_queue(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    settings = stack_settings(
        make_settings, openai_server, storage="redis", debounce_seconds=60.0, max_delay_seconds=600
    )
    env = memq_env(settings)
    worker = celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    queue = QueueClient(settings, redis_client)
    producer = producer_for(settings)

    # A memory, then a dead letter (the model refuses the request for good).
    openai_server.responder = learn_items
    assert producer.flush("t-0", "fey", None, turn("item-5551000"))
    wait_for(lambda: facts_of(settings, "fey"), what="fey's first memory")
    openai_server.script(Reply(status=400))
    assert producer.flush("t-dead", "fey", None, turn("item-5551001"))
    wait_for(lambda: queue.stats()["dead"] == 1, what="the dead letter")
    # An extraction in flight (its model call answers once the forget is done), and a turn
    # still debouncing.
    answer = threading.Event()
    openai_server.script(Reply(content=json.dumps(_answer("item-5551002")), release=answer))
    calls = openai_server.call_count
    assert producer.flush("t-run", "fey", None, turn("item-5551002"))
    wait_for(lambda: openai_server.call_count == calls + 1, what="the call in flight")
    assert producer.after_agent("t-wait", "fey", None, turn("item-5551003"))
    assert producer.after_agent("t-gus", "gus", None, turn("item-9"))

    done = subprocess.run(
        [sys.executable, "-m", "memq.cli", "forget", "fey", "--json"],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=DEADLINE_SECONDS,
        check=False,
    )
    answer.set()
    assert done.returncode == 0, done.stderr
    removed = json.loads(done.stdout)["removed"]
    assert (removed["documents"], removed["pending"], removed["in_flight"], removed["dead"]) == (
        1,
        1,
        1,
        1,
    )

    # The run in flight answers after the forget: its save must be refused.
    wait_for(
        lambda: "outcome=stale answer discarded" in worker.log_text(),
        what="the in-flight run discarded",
    )
    assert facts_of(settings, "fey") == []
    assert get_storage(settings).list_agents("fey") == []
    # Markers no other test uses: the redis-server is shared by the whole suite.
    leftovers = {
        key: value
        for key, value in dump_redis(redis_client).items()
        if any(f"item-{5551000 + n}" in value for n in range(4)) or ":fey:" in key
    }
    assert leftovers == {}
    # The other user's pending turn is still there, and a second forget finds nothing.
    assert queue.stats()["due"] == 1
    again = subprocess.run(
        [sys.executable, "-m", "memq.cli", "forget", "fey"],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=DEADLINE_SECONDS,
        check=False,
    )
    assert again.returncode == 0 and "nothing held about user fey" in again.stdout
    assert not queue_idle(queue)  # gus's turn waits for its debounce


def _answer(item: str) -> dict[str, Any]:
    return {
        "user": {},
        "history": {},
        "newFacts": [
            {"content": f"The user owns {item}", "category": "context", "confidence": 0.9}
        ],
        "factsToRemove": [],
    }
