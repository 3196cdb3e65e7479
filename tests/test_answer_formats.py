"""Answers any model can give, end to end: a real Celery worker and beat, a real Redis, the real
`openai` client against the scripted server playing an endpoint that refuses `json_schema`.

The refusal costs one request for the whole worker process (never one per extraction, never a
paid attempt); the batch lane's request lines ask for what the synchronous calls learnt; an
answer that leaves its lists out is "no change", counted, not a retry or a dead letter; a
placeholder id in `factsToRemove` is ignored and counted.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from memq.core.connection import redis_client
from memq.core.settings import MemqSettings
from memq.testing.provider import ResponseFormats
from prompts.answer import answer_json_schema
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import (
    fact_for,
    facts_of,
    learn_items,
    queue_idle,
    stack_settings,
    turn,
    update_answer,
)
from tests.support.waiting import wait_for
from worker.queue import QueueClient

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

# Real ids: an e-mail, an Auth0 subject, Chinese, a dotted one.
USERS = ("alice@example.com", "auth0|abc", "李雷", "bob.smith", "carol%2F", "dave")
SCHEMA_IN_JSON_MODE = {"type": "json_object", "schema": answer_json_schema()}


def metrics(settings: MemqSettings) -> dict[str, int]:
    client = redis_client(settings)
    try:
        raw = client.hgetall(QueueClient(settings, client).keys.metrics())
        return {str(k): int(v) for k, v in raw.items()}
    finally:
        client.close()


def start(celery_procs: CeleryProcs, settings: MemqSettings) -> None:
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2, pool="threads")  # one process, two threads
    celery_procs.start_beat(env)


def idle(settings: MemqSettings) -> bool:
    client = redis_client(settings)
    try:
        return queue_idle(QueueClient(settings, client))
    finally:
        client.close()


@pytest.mark.parametrize("status", [400, 500], ids=["openai-400", "llama-cpp-python-500"])
def test_an_endpoint_that_refuses_the_schema_costs_one_refusal_for_the_whole_process(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    status: int,
) -> None:
    openai_server.provider.formats = ResponseFormats(refuse=("json_schema",), status=status)
    openai_server.responder = learn_items
    settings = stack_settings(make_settings, openai_server)
    start(celery_procs, settings)
    producer = producer_for(settings)
    for n, user in enumerate(USERS):
        assert producer.flush(f"t-{n}", user, None, turn(f"item-{n}"))
        wait_for(lambda u=user: facts_of(settings, u) != [], what=f"{user} learnt")
    assert [facts_of(settings, u) for u in USERS] == [[fact_for(f"item-{n}")] for n in range(6)]

    assert openai_server.refusals == [status]  # one, for six extractions
    assert openai_server.call_count == len(USERS) + 1
    formats = [r["response_format"] for r in openai_server.requests]
    assert formats[0]["type"] == "json_schema"
    assert formats[1:] == [SCHEMA_IN_JSON_MODE] * len(USERS)
    counts = metrics(settings)
    assert counts["billed_runs"] == len(USERS)  # the refused request is no run of the bill
    assert counts.get("extractions:retry", 0) == 0 and counts.get("extractions:dead", 0) == 0


def test_the_batch_lane_asks_for_what_the_synchronous_calls_learnt(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs, producer_for: Any
) -> None:
    openai_server.provider.formats = ResponseFormats(refuse=("json_schema",), status=500)
    openai_server.responder = learn_items
    settings = stack_settings(
        make_settings,
        openai_server,
        llm_batch_enabled=True,
        llm_batch_gather_seconds=0.0,
        llm_batch_poll_seconds=0.2,
    )
    start(celery_procs, settings)
    producer = producer_for(settings)
    assert producer.flush("t-sync", USERS[0], None, turn("item-0"))  # a flush: synchronous
    wait_for(lambda: facts_of(settings, USERS[0]) != [], what="the flush extracted")
    assert producer.after_agent("t-batch", USERS[1], None, turn("item-1"))  # can wait: batch
    lines = wait_for(lambda: openai_server.batches.requests_of("in_progress"), what="a job out")
    assert [line["body"]["response_format"] for line in lines] == [SCHEMA_IN_JSON_MODE]
    assert openai_server.requests[-1]["response_format"] == SCHEMA_IN_JSON_MODE
    openai_server.batches.complete()
    wait_for(lambda: facts_of(settings, USERS[1]) != [], what="the batch applied")
    assert facts_of(settings, USERS[1]) == [fact_for("item-1")]


def test_an_answer_without_its_lists_is_no_change_and_counted(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs, producer_for: Any
) -> None:
    """The 1.5B model's dead letter of today: summaries only, no newFacts, no factsToRemove."""
    summaries_only = {
        "user": {"workContext": {"summary": "", "shouldUpdate": False}},
        "history": {"recentMonths": {"summary": "", "shouldUpdate": False}},
    }
    placeholder = json.loads(update_answer("The user owns a pnpm monorepo"))
    placeholder["factsToRemove"] = ["<fact id>"]
    openai_server.script(
        Reply(content=json.dumps(summaries_only)), Reply(content=json.dumps(placeholder))
    )
    settings = stack_settings(make_settings, openai_server)
    start(celery_procs, settings)
    producer = producer_for(settings)
    assert producer.flush("t-1", USERS[0], None, turn("item-1"))
    wait_for(lambda: metrics(settings).get("extractions:unchanged") == 1, what="run 1")
    assert facts_of(settings, USERS[0]) == []
    assert producer.flush("t-2", USERS[0], None, turn("item-2", "It is a pnpm monorepo."))
    wait_for(lambda: facts_of(settings, USERS[0]) != [], what="the second run")
    wait_for(lambda: idle(settings), what="the queue drained")
    assert facts_of(settings, USERS[0]) == ["The user owns a pnpm monorepo"]

    assert openai_server.call_count == 2  # no second attempt for either answer's shape
    counts = metrics(settings)
    assert counts["answers_missing_fields"] == 1
    assert counts["removals_unknown"] == 1
    assert counts.get("extractions:retry", 0) == 0 and counts.get("extractions:dead", 0) == 0
