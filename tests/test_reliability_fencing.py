"""Fenced writes and the run's time budget, with real Celery workers and the real openai client.

A run that lost its claim — its worker paused past the lease, or the run outliving its time budget —
must never change the memory, on either storage: its answer is discarded, its tokens still counted.
And a model slower than the lease must not get a run killed, retried or dead-lettered: the lease is
renewed for the run's whole budget, under prefork and threads alike.

Each test gives the two runs different answers, so a duplicate write or an overwrite is visible.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from memq.core.settings import MemqSettings
from storage import get_storage
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import facts_of, queue_idle, stack_settings, turn, update_answer
from tests.support.waiting import wait_for
from worker.queue import QueueClient

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.integration]

FIRST = "The user owns the first answer"
SECOND = "The user owns the second answer"


def _history_adds(settings: MemqSettings, user: str) -> list[str]:
    return [c.content or "" for c in get_storage(settings).history(user, None) if c.action == "add"]


@pytest.mark.parametrize("storage", ["file", "redis"])
def test_a_worker_paused_past_its_lease_never_writes_its_answer(
    storage: str,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    # The paused run's answer is on the wire when it resumes; the second run's comes at once.
    openai_server.script(
        Reply(content=update_answer(FIRST), delay_seconds=1.0, prompt_tokens=111),
        Reply(content=update_answer(SECOND), prompt_tokens=222),
    )
    settings = stack_settings(make_settings, openai_server, lease_seconds=2.0, storage=storage)
    env = memq_env(settings)
    paused = celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    queue = QueueClient(settings, redis_client)

    assert producer_for(settings).flush("t-pause", "pia", None, turn("item-1"))
    wait_for(lambda: openai_server.call_count == 1, what="the first LLM call")
    paused.signal_group(signal.SIGSTOP)  # a VM pause, a long GC: the lease runs out meanwhile
    try:
        celery_procs.start_worker(env, concurrency=2)
        wait_for(lambda: facts_of(settings, "pia") == [SECOND], what="second run")
        wait_for(lambda: queue_idle(queue), what="the second run settled")
    finally:
        paused.signal_group(signal.SIGCONT)
    paused.wait_for_log(" outcome=")  # the resumed run has settled

    assert facts_of(settings, "pia") == [SECOND]  # neither added to nor overwritten
    assert "outcome=stale answer discarded" in paused.log_text()
    assert _history_adds(settings, "pia") == [SECOND]
    assert openai_server.call_count == 2
    metrics = queue.stats()
    assert metrics["stale_runs"] == 1 and metrics["completed_total"] == 1
    assert metrics["prompt_tokens"] == 111 + 222  # the discarded answer was paid for all the same


@pytest.mark.parametrize("storage", ["file", "redis"])
def test_a_run_past_its_time_budget_loses_its_claim_and_never_writes(
    storage: str,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    """Under the threads pool nothing can stop a run: once its budget is spent the lease is no
    longer renewed, the context goes to another run, and the late answer is fenced off."""
    answers = [update_answer(FIRST), update_answer(SECOND)]
    # First call: a 429 whose Retry-After the client sleeps through, so the run's retry comes
    # after its budget (3 s + 1 s of grace) and its last lease (0.6 s) have run out. The two
    # later calls (the retry, and the second run's) get different answers, in arrival order.
    openai_server.script(Reply(status=429, headers={"Retry-After": "7"}))
    openai_server.responder = lambda request: Reply(content=answers.pop(0))
    settings = stack_settings(
        make_settings,
        openai_server,
        lease_seconds=0.6,
        llm_timeout_seconds=3.0,
        llm_max_retries=1,
        run_time_limit_seconds=3.0,
        storage=storage,
    )
    env = memq_env(settings)
    worker = celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    queue = QueueClient(settings, redis_client)

    assert producer_for(settings).flush("t-budget", "bo", None, turn("item-1"))
    wait_for(lambda: openai_server.call_count == 3, what="both runs' model calls")
    wait_for(
        lambda: worker.log_text().count(" outcome=") == 2,
        what="both runs settled",
    )
    wait_for(lambda: queue_idle(queue), what="the queue drained")

    facts = facts_of(settings, "bo")
    assert len(facts) == 1 and facts[0] in (FIRST, SECOND)  # one answer, never both
    assert _history_adds(settings, "bo") == facts
    assert "outcome=stale answer discarded" in worker.log_text()
    assert "past its time budget" in worker.log_text()
    assert queue.stats()["stale_runs"] == 1


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_model_slower_than_the_lease_runs_once(
    pool: str,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    """A model call of 3 s against a 2 s lease: the run keeps its claim (renewed), is not killed by
    a time limit derived from the lease, and is neither retried nor dead-lettered."""
    openai_server.script(Reply(content=update_answer(FIRST), delay_seconds=3.0))
    settings = stack_settings(make_settings, openai_server, lease_seconds=2.0, storage="redis")
    env = memq_env(settings)
    worker = celery_procs.start_worker(env, concurrency=1, pool=pool)
    celery_procs.start_beat(env)
    queue = QueueClient(settings, redis_client)

    assert producer_for(settings).flush("t-slow", "sam", None, turn("item-1"))
    wait_for(lambda: facts_of(settings, "sam") == [FIRST], what="the extraction")
    wait_for(lambda: queue_idle(queue), what="the queue drained")

    assert openai_server.call_count == 1
    stats = queue.stats()
    assert stats["dead"] == 0
    assert stats["extractions"] == {"updated": 1}
    assert "SoftTimeLimitExceeded" not in worker.log_text()
