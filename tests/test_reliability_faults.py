"""Reliability (issue 6): a faulty LLM endpoint and racing tickers.

The scripted server answers 500, 429 with Retry-After, hangs past the client timeout, and returns
garbage or truncated JSON; every context ends extracted or dead with its reason, every stored
document validates, and `memq dead retry` finishes the job once the endpoint is healthy. Two beats
at once never make an LLM call twice for one version.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Any

import pytest

from memq.cli import main
from memq.core.identity import ContextKey
from memq.core.settings import MemqSettings
from producer import MemoryProducer
from storage.document import MemoryDocument
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import (
    ITEM,
    conversation_of,
    fact_for,
    facts_of,
    learn_items,
    queue_idle,
    stack_settings,
    turn,
)
from tests.support.waiting import wait_for
from worker.queue import QueueClient

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.integration]

FAULTS: dict[str, Reply] = {
    "500": Reply(status=500),
    "429": Reply(status=429, headers={"Retry-After": "1"}),
    "hang": Reply(content="{}", delay_seconds=2.5),  # past llm_timeout_seconds=1
    "garbage": Reply(content="I think the user likes cats, probably."),
    "truncated": Reply(content='{"user": {}, "newFacts": [{"content": "The user own'),
}
# Per context: the faults its first calls meet, then a healthy answer. The doomed ones only fail.
PLANS: dict[int, list[str]] = {
    0: ["500"],
    1: ["429"],
    2: ["hang"],
    3: ["garbage", "truncated"],
    4: ["truncated", "500"],
    5: [],
    6: ["500", "garbage", "hang", "429"],  # more faults than max_attempts=3: dead
    7: ["garbage"] * 5,  # dead
}
DOOMED = {6, 7}


class FaultyModel:
    """Follows PLANS per context (recognised by its item) until ``healthy`` is set."""

    def __init__(self) -> None:
        self.healthy = threading.Event()
        self.calls: Counter[int] = Counter()
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> Reply:
        found = ITEM.findall(conversation_of(request))
        if not found or self.healthy.is_set():
            return learn_items(request)
        n = int(found[0].split("-")[1])
        with self.lock:
            call = self.calls[n]
            self.calls[n] += 1
        plan = PLANS.get(n, [])
        return FAULTS[plan[call]] if call < len(plan) else learn_items(request)


def test_llm_faults_end_extracted_or_dead_with_a_reason_and_dead_ones_retry(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    redis_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = FaultyModel()
    openai_server.responder = model
    settings: MemqSettings = stack_settings(
        make_settings,
        openai_server,
        llm_timeout_seconds=1.0,
        max_attempts=3,
        lease_seconds=10.0,
        storage="file",  # the check below reads the documents on disk
    )
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_beat(env)
    queue = QueueClient(settings, redis_client)

    with MemoryProducer(settings) as producer:
        for n in PLANS:
            assert producer.flush(f"t{n}", f"f{n}", None, turn(f"item-{n}"))

    def settled() -> bool:
        return queue_idle(queue) and queue.stats()["dead"] == len(DOOMED)

    wait_for(settled, interval=0.2, what="every context extracted or dead")
    for n in PLANS:
        expected = [] if n in DOOMED else [fact_for(f"item-{n}")]
        assert facts_of(settings, f"f{n}") == expected, (n, celery_procs.logs())
    dead = {ContextKey.from_id(e.context_id).user_id: e for e in queue.dead_list()}
    assert set(dead) == {f"f{n}" for n in DOOMED}
    assert dead["f6"].attempts == 3 and "TransientLLMError" in dead["f6"].last_error
    assert dead["f7"].attempts == 3 and "ResponseParseError" in dead["f7"].last_error
    # Every document on disk is a whole, valid memory document (no partial write on a fault).
    files = sorted(settings.storage_dir.rglob("memory.json"))
    assert len(files) == len(PLANS) - len(DOOMED)
    for path in files:
        MemoryDocument.model_validate_json(path.read_text(encoding="utf-8"))

    model.healthy.set()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["dead", "retry", "--all"]) == 0
    assert "2 dead context(s) retried" in capsys.readouterr().out
    wait_for(
        lambda: all(facts_of(settings, f"f{n}") == [fact_for(f"item-{n}")] for n in DOOMED),
        what="the retried dead letters extracted",
    )
    wait_for(lambda: queue_idle(queue) and queue.stats()["dead"] == 0)


_EXTRACTED = re.compile(r"extraction key=(\S+) version=(\d+) outcome=(updated|unchanged)")
# The end of every run that called the model (a run stale before it started, deferred or parked
# for a batch never did).
_SETTLED = re.compile(r"extraction key=\S+ version=\d+ outcome=(?!stale \(|deferred|batched)")


def test_two_beats_make_one_llm_call_per_version(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    redis_client: Any,
) -> None:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, tick_seconds=0.1, debounce_seconds=1.0
    )
    env = memq_env(settings)
    worker = celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_beat(env)
    celery_procs.start_beat(env)
    queue = QueueClient(settings, redis_client)
    contexts = 20

    def settled(at_least: int) -> bool:
        """At least ``at_least`` model calls, nothing queued, and every call's run logged: a run
        leaves the in-flight set before it counts and logs itself, so an idle queue alone can be
        seen while the last run's counter and log line are still to come."""
        calls = openai_server.call_count
        if calls < at_least or not queue_idle(queue):
            return False
        return len(_SETTLED.findall(worker.log_text())) >= calls

    with MemoryProducer(settings) as producer:
        for n in range(contexts):  # two turns inside one debounce window: one version processed
            assert producer.after_agent(f"t{n}", f"b{n}", None, turn(f"item-{n}"))
            assert producer.after_agent(f"t{n}", f"b{n}", None, turn(f"item-{n}", "Thanks!"))
        wait_for(lambda: settled(contexts), interval=0.1, what="the first round settled")
        first_log = worker.log_text()
        calls = openai_server.call_count  # more than `contexts` when a thread was split
        for n in range(0, contexts, 2):  # a second version for half of them: the thread grew
            grown = turn(f"item-{n}", "Thanks!") + turn(f"item-{n}", "Once more.")
            assert producer.flush(f"t{n}", f"b{n}", None, grown)
        wait_for(
            lambda: settled(calls + contexts // 2), interval=0.1, what="the second round settled"
        )

    # A settled context's versions count from 1 again, so each round is checked on its own.
    rounds = [first_log, worker.log_text()[len(first_log) :]]
    runs = [[(key, version) for key, version, _ in _EXTRACTED.findall(r)] for r in rounds]
    # Never one version extracted twice. (A loaded machine can split a thread's two quick turns
    # over two versions when the second comes after the debounce: more versions, never repeats.)
    for done in runs:
        assert len(done) == len(set(done)), celery_procs.logs()
    assert len(runs[0]) >= contexts and len(runs[1]) == contexts // 2, celery_procs.logs()
    assert openai_server.call_count == len(runs[0]) + len(runs[1])
    assert queue.stats()["completed_total"] == openai_server.call_count
    assert all(facts_of(settings, f"b{n}") == [fact_for(f"item-{n}")] for n in range(contexts))
