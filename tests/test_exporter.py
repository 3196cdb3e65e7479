"""`memq exporter`: a known workload through a real worker (N extracted, M dead-lettered by a
permanent LLM error, known token counts) shows up exactly in `/metrics`, read with
prometheus_client's own parser; a Redis outage is `memq_up 0`, not a failed scrape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.exposition import generate_latest

from memq.core.settings import MemqSettings
from memq.local.redis_server import free_port
from memq.server.exporter import build_registry
from producer import MemoryProducer
from tests.support.celery_procs import REPO_ROOT, CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.prometheus import Samples, parse, value
from tests.support.scenarios import conversation_of, queue_idle, stack_settings
from tests.support.waiting import wait_for
from worker.queue import QueueClient

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

GOOD, DOOMED = 5, 2
PROMPT_TOKENS, COMPLETION_TOKENS = 123, 45


def answer(request: dict[str, Any]) -> Reply:
    if "doomed" in conversation_of(request):
        return Reply(status=401, body={"error": {"message": "invalid api key"}})
    update = {
        "user": {},
        "history": {},
        "newFacts": [{"content": "The user keeps bees", "category": "context", "confidence": 0.9}],
        "factsToRemove": [],
    }
    return Reply(
        content=json.dumps(update),
        prompt_tokens=PROMPT_TOKENS,
        completion_tokens=COMPLETION_TOKENS,
    )


def talk(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]


@pytest.fixture
def exporter_process(tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str]) -> str:
        port = free_port()
        full = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
        full.update(env, MEMQ_EXPORTER_PORT=str(port), PYTHONPATH=str(REPO_ROOT))
        log = (tmp_path / "exporter.log").open("wb")
        started.append(
            subprocess.Popen(
                [str(Path(sys.executable).with_name("memq")), "exporter"],
                env=full,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        )
        return f"http://127.0.0.1:{port}/metrics"

    yield start
    for process in started:
        process.terminate()
        assert process.wait(timeout=10) == 0  # SIGTERM is a clean stop


def scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode("utf-8"))
    except OSError:
        return None


def test_metrics_match_a_known_workload(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    redis_client: redis.Redis,
    exporter_process: Any,
) -> None:
    openai_server.responder = answer
    settings: MemqSettings = stack_settings(make_settings, openai_server, max_attempts=3)
    env = memq_env(settings)
    before = time.time()
    celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_beat(env)
    url = exporter_process(env)
    queue = QueueClient(settings, redis_client)

    with MemoryProducer(settings) as producer:
        for n in range(GOOD):
            assert producer.flush(f"t{n}", f"keeper{n}", None, talk("I keep bees."))
        for n in range(DOOMED):
            assert producer.flush(f"d{n}", f"gone{n}", "Bot", talk("This one is doomed."))
    wait_for(
        lambda: queue_idle(queue) and queue.stats()["dead"] == DOOMED,
        interval=0.1,
        what="every context extracted or dead",
    )

    def counted() -> Samples | None:
        # A task counts its outcome just after it settles the queue: wait for the counts, then
        # check every figure on that one scrape.
        text = scrape(url)
        samples = parse(text) if text else {}
        done = samples and (
            value(samples, "memq_extractions_total", outcome="updated"),
            value(samples, "memq_extractions_total", outcome="dead"),
            value(samples, "memq_tick_claimed_total"),
        ) == (GOOD, DOOMED, GOOD + DOOMED)
        return samples if done else None

    samples = wait_for(counted, interval=0.1, what="the workload counted in /metrics")
    assert value(samples, "memq_up") == 1
    assert value(samples, "memq_extractions_total", outcome="updated") == GOOD
    assert value(samples, "memq_extractions_total", outcome="dead") == DOOMED
    assert value(samples, "memq_extractions_total", outcome="retry") == 0
    assert value(samples, "memq_dead", shard="0") == DOOMED
    assert value(samples, "memq_dead_lettered_total") == DOOMED
    assert value(samples, "memq_due", shard="0") == 0
    assert value(samples, "memq_inflight", shard="0") == 0
    assert value(samples, "memq_prompt_tokens_total") == GOOD * PROMPT_TOKENS
    assert value(samples, "memq_completion_tokens_total") == GOOD * COMPLETION_TOKENS
    assert value(samples, "memq_llm_requests_total", result="ok") == GOOD
    assert value(samples, "memq_llm_requests_total", result="client_error") == DOOMED
    assert value(samples, "memq_llm_latency_seconds_count") == GOOD + DOOMED
    assert value(samples, "memq_llm_latency_seconds_bucket", le="+Inf") == GOOD + DOOMED
    assert value(samples, "memq_tick_claimed_total") == GOOD + DOOMED
    assert value(samples, "memq_last_tick_timestamp_seconds") >= before
    # No user, thread or agent id leaks into a label.
    labels = {v for _, pairs in samples for _, v in pairs}
    assert not any("keeper" in label or "gone" in label for label in labels)


def test_a_redis_outage_is_memq_up_zero(settings: MemqSettings) -> None:
    client = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=1)
    samples = parse(generate_latest(build_registry(settings, client)).decode())
    assert value(samples, "memq_up") == 0
    assert all(name == "memq_up" for name, _ in samples)
