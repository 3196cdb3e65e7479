"""The batch lane's settlement, in process against a real Redis and the scripted server's files
and batches endpoints (the real `openai` client): the extract task parks, the lane gathers and
polls on a clock the test moves.

What the end-to-end tests cannot time: a flush that arrives while the run is parked supersedes
the batch (its answer is fenced off, the flush's run extracts everything once); a worker killed
between its fenced save and its settlement leaves an answer the next poll settles without
applying again; and an output file's hostile lines are skipped, never trusted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memq.core.clock import now_ms
from memq.core.identity import ContextKey
from memq.core.metrics import read_counts, read_snapshot, summarise
from memq.core.models import ConversationContext
from memq.core.settings import MemqSettings
from memq.evaluation.locomo import read_locomo
from memq.evaluation.report import Models, build_result
from memq.evaluation.report import PriceTable as EvalPrices
from memq.evaluation.scoring import Prices
from memq.testing.provider import (
    PrefixCache,
    Provider,
    cached_tokens_for,
    common_prefix,
    prompt_text,
)
from storage.base import Fence
from tests.support.clock import ShiftedClock
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import (
    document_of,
    fact_for,
    facts_of,
    learn_items,
    stack_settings,
    turn,
)
from worker.batch import BatchLane, run_from_json
from worker.batch_api import OpenAIBatchEndpoint
from worker.batch_jobs import custom_id, read_results
from worker.batch_queue import parked_with
from worker.cost import CallUsage, PriceTable, prompt_cache_key
from worker.model import ModelAnswer
from worker.runtime import WorkerRuntime
from worker.tasks import extract

pytestmark = [pytest.mark.integration]

USER = "auth0|abc"
EVAL_DATA = Path(__file__).parent / "data" / "eval"


def lane_for(settings: MemqSettings) -> tuple[WorkerRuntime, BatchLane, ShiftedClock]:
    """A worker's runtime and its batch lane on a clock the test moves."""
    runtime = WorkerRuntime(settings)
    clock = ShiftedClock()
    endpoint = OpenAIBatchEndpoint(settings)
    lane = BatchLane(
        settings, runtime.queue, runtime.batches, runtime.pipeline, endpoint, clock=clock
    )
    return runtime, lane, clock


# --- one settlement for both lanes: what a run answered synchronously records, a run answered
# by a batch job records the same way (budget, counters, log line).

LANES = ["sync", "batch"]
PRICES = {
    "llm_price_input_per_million": 1.0,
    "llm_price_cached_input_per_million": 0.25,
    "llm_price_output_per_million": 2.0,
}


def lane_settings_for(lane: str, make_settings: Any, server: ScriptedOpenAI, **values: Any) -> Any:
    return stack_settings(
        make_settings,
        server,
        llm_batch_enabled=lane == "batch",
        llm_batch_gather_seconds=0.0,
        llm_batch_poll_seconds=1.0,
        **values,
    )


@pytest.fixture
def lane_parts(
    make_settings: Any, openai_server: ScriptedOpenAI
) -> Iterator[tuple[MemqSettings, WorkerRuntime, BatchLane, ShiftedClock]]:
    openai_server.responder = learn_items
    settings = stack_settings(
        make_settings,
        openai_server,
        llm_batch_enabled=True,
        llm_batch_gather_seconds=0.0,
        llm_batch_poll_seconds=1.0,
    )
    runtime, lane, clock = lane_for(settings)
    yield settings, runtime, lane, clock


def run_due(runtime: WorkerRuntime, clock: ShiftedClock) -> list[str]:
    """Claim what is due and run it as the extract task would; each run's outcome."""
    batch = runtime.queue.claim(clock())
    return [
        str(extract(runtime, c.context_id, c.token, clock=clock)["outcome"]) for c in batch.claims
    ]


def test_a_flush_while_parked_supersedes_the_batch_and_extracts_everything_once(
    lane_parts: Any, openai_server: ScriptedOpenAI, producer_for: Any
) -> None:
    settings, runtime, lane, clock = lane_parts
    producer = producer_for(settings)
    assert producer.after_agent("t1", USER, None, turn("item-1"))
    assert run_due(runtime, clock) == ["batched"]
    stats = summarise(read_snapshot(runtime.queue.redis, settings, now_ms()))
    assert (stats["batch_pending"], stats["shards"][0]["batch_pending"]) == (1, 1)  # memq stats
    assert producer.after_agent("t1", USER, None, turn("item-1") + turn("item-2"))
    assert run_due(runtime, clock) == []  # parked: not claimed again for a plain turn
    assert producer.flush("t1", USER, None, turn("item-1") + turn("item-2"))
    assert run_due(runtime, clock) == ["updated"]  # the flush runs at once, synchronously
    # Its claim took the context out of the lane at once: nothing parked is left to gather.
    assert runtime.batches.depths() == {"batch_pending": 0, "batch_out": 0, "batch_jobs": 0}
    assert openai_server.call_count == 1
    assert sorted(facts_of(settings, USER)) == [fact_for("item-1"), fact_for("item-2")]

    report = lane.cycle()  # the parked request is stale: no job, and it leaves the lane
    assert report.jobs_created == 0
    assert openai_server.batches.jobs == {}
    assert runtime.batches.depths() == {"batch_pending": 0, "batch_out": 0, "batch_jobs": 0}
    assert not runtime.batches.has_work(clock())


def test_an_answer_saved_before_a_kill_is_settled_without_being_applied_again(
    lane_parts: Any, openai_server: ScriptedOpenAI, producer_for: Any
) -> None:
    settings, runtime, lane, clock = lane_parts
    producer = producer_for(settings)
    assert producer.after_agent("t2", USER, None, turn("item-4"))
    assert run_due(runtime, clock) == ["batched"]
    assert lane.cycle().jobs_created == 1
    openai_server.batches.complete()

    # A worker saved this answer under the job's fence and died before settling it.
    (request,) = runtime.batches.job_requests(
        runtime.batches.keys.shard(0), next(iter(openai_server.batches.jobs))
    )
    data = runtime.queue.load(request.context_id)
    saved = ModelAnswer(
        json.dumps(
            {
                "user": {},
                "history": {},
                "newFacts": [
                    {"content": "saved before the kill", "category": "context", "confidence": 0.9}
                ],
                "factsToRemove": [],
            }
        )
    )
    runtime.pipeline.apply_answer(
        ConversationContext.from_hash(data),
        saved,
        run_from_json(data["batch_run"], "scripted"),
        watermark=data["batch_watermark"],
        fence=Fence(request.context_id, request.token),
    )

    clock.advance(2)
    report = lane.cycle()
    assert report.applied == 1
    assert facts_of(settings, USER) == ["saved before the kill"]  # the job's answer not again
    assert runtime.queue.load(request.context_id) == {}  # settled
    assert openai_server.call_count == 0


@pytest.mark.parametrize(
    ("fields", "token", "parked"),
    [
        ({"claim_token": "7", "batch_token": "7"}, "7", True),
        ({"claim_token": b"7", "batch_token": b"7"}, "7", True),  # as Redis answers
        ({"claim_token": "8", "batch_token": "7"}, "7", False),  # a flush claimed it since
        ({"claim_token": "7"}, "7", False),  # claimed, never parked
        ({"batch_token": "7"}, "7", False),  # claim released
        ({}, "", False),
        ({"claim_token": "", "batch_token": ""}, "", False),
    ],
)
def test_parked_with_this_token_is_one_rule(
    fields: dict[str, Any], token: str, parked: bool
) -> None:
    assert parked_with(fields, token) is parked


def test_hostile_output_lines_are_skipped_and_only_our_requests_are_read() -> None:
    good = {
        "custom_id": custom_id("42"),
        "response": {
            "status_code": 200,
            "body": {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "{}"},
                    }
                ],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
            },
        },
        "error": None,
    }
    lines = [
        "{not json",
        "[" * 5000,
        json.dumps({"custom_id": "memq-../../etc", "response": good["response"]}),
        json.dumps({"custom_id": "someone-else-1", "response": good["response"]}),
        json.dumps({"custom_id": custom_id("43"), "response": {"status_code": 200, "body": "x"}}),
        json.dumps({"custom_id": custom_id("44"), "error": {"code": "batch_expired" * 100}}),
        json.dumps({"custom_id": custom_id("45"), "response": {"status_code": 500, "body": {}}}),
        "\u202e\x00" * 1000,
        json.dumps(good),
    ]
    results = read_results("\n".join(lines), "m")
    assert set(results) == {"42", "43", "44", "45"}
    answer = results["42"].answer
    assert answer is not None and (answer.prompt_tokens, answer.completion_tokens) == (7, 3)
    assert results["43"].answer is None and results["43"].error == "unreadable response"
    assert results["44"].answer is None and len(results["44"].error) < 100
    assert results["45"].error == "request answered 500"


@pytest.mark.parametrize("overrides", ["prompt budget", "pending bytes"])
def test_over_size_contexts_stay_synchronous(
    overrides: str, make_settings: Any, openai_server: ScriptedOpenAI, producer_for: Any
) -> None:
    openai_server.responder = learn_items
    values: dict[str, Any] = {"llm_batch_enabled": True, "llm_batch_gather_seconds": 0.0}
    if overrides == "prompt budget":  # the new messages need more than one prompt
        values.update(conversation_max_tokens=200)
    else:  # more pending text than a context may hold before it is due at once
        values.update(producer_max_chars=10_000, pending_max_bytes=10_000)
    settings = stack_settings(make_settings, openai_server, **values)
    runtime = WorkerRuntime(settings)
    clock = ShiftedClock()
    producer = producer_for(settings)
    long = "x" * 6_000
    turns = turn("item-1", long) + turn("item-2", long)
    assert producer.after_agent("t3", USER, None, turns[:2])
    assert producer.after_agent("t3", USER, None, turns)
    outcomes = run_due(runtime, clock)
    assert outcomes and "batched" not in outcomes
    assert openai_server.call_count >= 1
    assert runtime.batches.depths()["batch_pending"] == 0


def test_a_parked_run_keeps_what_its_facts_will_cite_excerpts_included() -> None:
    """A batch answer's facts get the sources a synchronous run's get: the parked run comes back
    whole, the excerpts of cited messages included; a run parked before excerpts reads too."""
    import json
    from datetime import UTC, datetime

    from storage.provenance import RunInfo, RunMessage
    from worker.batch import run_to_json

    run = RunInfo(
        thread_id="t-1",
        run_id="r-1",
        at=datetime(2026, 12, 1, 9, 0, tzinfo=UTC),
        messages=(
            RunMessage("m1", "d1", "user", "I moved to Berlin 李雷 &lt;b"),
            RunMessage("m2", "d2", "assistant", ""),
        ),
        model="scripted",
        prompt_version="v3",
        user_confirmed=True,
    )
    assert run_from_json(run_to_json(run), "scripted") == run
    older = json.loads(run_to_json(run))
    older["messages"] = [m[:3] for m in older["messages"]]
    assert [m.excerpt for m in run_from_json(json.dumps(older), "scripted").messages] == ["", ""]


def test_a_batch_answer_is_billed_with_its_cached_tokens_its_turns_and_the_batch_discount(
    make_settings: Any, openai_server: ScriptedOpenAI, producer_for: Any
) -> None:
    # The provider counts the prompt and caches prefixes in batch jobs as it does synchronously.
    openai_server.provider = Provider(cache=PrefixCache())
    openai_server.responder = learn_items
    settings = lane_settings_for("batch", make_settings, openai_server, **PRICES)
    runtime, lane, clock = lane_for(settings)
    producer = producer_for(settings)
    sent = turn("item-1")
    for item in ("item-1", "item-2"):
        sent = sent if item == "item-1" else sent + turn(item)
        assert producer.after_agent("t4", USER, None, sent)
        assert run_due(runtime, clock) == ["batched"]
        assert lane.cycle().jobs_created == 1
        openai_server.batches.complete()
        clock.advance(2)
        assert lane.cycle().applied == 1
    assert sorted(facts_of(settings, USER)) == [fact_for("item-1"), fact_for("item-2")]

    # Each request carries the user's cache key, as a synchronous call does.
    bodies = openai_server.batches.answered
    key = prompt_cache_key(settings.key_prefix, USER, None)
    assert [b.get("prompt_cache_key") for b in bodies] == [key, key]
    tokenizer = openai_server.provider.tokenizer
    assert tokenizer is not None
    tokens = [tokenizer(prompt_text(b)) for b in bodies]
    cached = cached_tokens_for(common_prefix(tokens[0], tokens[1]))
    assert cached >= 1024  # the static part and the memory before the new fact

    snapshot = read_snapshot(runtime.queue.redis, settings, now_ms()).metrics
    assert snapshot["batch_prompt_tokens"] == sum(len(t) for t in tokens)
    assert snapshot["batch_cached_tokens"] == cached
    assert snapshot["billed_runs"] == 2
    assert snapshot["turns_extracted"] == 4  # the two new messages of each run
    prices = PriceTable(1.0, 0.25, 2.0, batch_discount=0.5)
    usage = [
        CallUsage(len(tokens[0]), 0, 20, "batch"),
        CallUsage(len(tokens[1]), cached, 20, "batch"),
    ]
    assert snapshot["cost_nano_usd"] == sum(prices.cost_nano_usd(u) for u in usage)
    assert snapshot.cost_per_1000_turns_usd == pytest.approx(snapshot.cost_usd * 1000 / 4)


def answer_one_run(
    lane: str, runtime: WorkerRuntime, lane_: BatchLane, clock: ShiftedClock, server: ScriptedOpenAI
) -> None:
    """Run what is due through ``lane`` until its answer is settled."""
    if lane == "sync":
        assert run_due(runtime, clock) == ["updated"]
        return
    assert run_due(runtime, clock) == ["batched"]
    assert lane_.cycle().jobs_created == 1
    server.batches.complete()
    clock.advance(2)
    assert lane_.cycle().applied == 1


def tokens_billed(settings: MemqSettings, runtime: WorkerRuntime) -> int:
    m = read_snapshot(runtime.queue.redis, settings, now_ms()).metrics
    return sum(
        m[f"{lane}{kind}_tokens"] for lane in ("", "batch_") for kind in ("prompt", "completion")
    )


@pytest.mark.parametrize("lane", LANES)
def test_the_batch_lane_defers_a_run_over_budget_exactly_as_the_synchronous_lane_does(
    lane: str, make_settings: Any, openai_server: ScriptedOpenAI, producer_for: Any
) -> None:
    openai_server.responder = learn_items
    user = "alice@example.com"
    settings = lane_settings_for(lane, make_settings, openai_server, llm_budget_tokens_per_user=1)
    runtime, lane_, clock = lane_for(settings)
    producer = producer_for(settings)
    budget = runtime.gates.budget
    assert budget is not None
    assert producer.after_agent("t-first", user, None, turn("item-1"))
    answer_one_run(lane, runtime, lane_, clock, openai_server)
    # The answered run spent what the provider billed: the user's budget is now spent.
    billed = tokens_billed(settings, runtime)
    assert billed > 0 and budget.spent(user) == (billed, billed)

    calls = (openai_server.call_count, len(openai_server.batches.jobs))
    assert producer.after_agent("t-second", user, None, turn("item-2"))
    assert run_due(runtime, clock) == ["deferred"]  # neither called nor parked
    lane_.cycle()
    assert (openai_server.call_count, len(openai_server.batches.jobs)) == calls
    assert budget.spent(user) == (billed, billed)  # nothing spent past the budget
    snapshot = read_snapshot(runtime.queue.redis, settings, now_ms())
    assert snapshot.metrics.deferred == {"budget": 1}
    assert sum(s.due for s in snapshot.shards) == 1  # waits in due for the next window
    assert runtime.batches.depths()["batch_pending"] == 0
    assert facts_of(settings, user) == [fact_for("item-1")]


def echoing_model(request: dict[str, Any]) -> Reply:
    """One good fact (cites the user's m1), one only the assistant said (m2), one invalid."""
    facts = [
        {"content": fact_for("item-1"), "category": "context", "confidence": 0.9, "cites": ["m1"]},
        {"content": "Has a cat", "category": "context", "confidence": 0.9, "cites": ["m2"]},
        {"content": "   ", "confidence": 0.9},
    ]
    body = {"user": {}, "history": {}, "newFacts": facts, "factsToRemove": []}
    return Reply(content=json.dumps(body))


@pytest.mark.parametrize("lane", LANES)
def test_both_lanes_count_and_log_dropped_facts_the_same_way(
    lane: str,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    producer_for: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    openai_server.responder = echoing_model
    settings = lane_settings_for(lane, make_settings, openai_server)
    runtime, lane_, clock = lane_for(settings)
    producer = producer_for(settings)
    assert producer.after_agent("t/5%.x", USER, None, turn("item-1"), trace_id="trace-7")
    with caplog.at_level(logging.INFO):
        answer_one_run(lane, runtime, lane_, clock, openai_server)
    assert facts_of(settings, USER) == [fact_for("item-1")]
    metrics = read_snapshot(runtime.queue.redis, settings, now_ms()).metrics
    assert (metrics["facts_invalid"], metrics["facts_refused"]) == (1, 1)
    assert metrics.extractions == {"updated": 1}
    (line,) = [r for r in caplog.records if getattr(r, "memq_outcome", None) == "updated"]
    assert line.name == "memq.extract"
    assert "facts_invalid=1 facts_refused=1" in line.getMessage()
    assert f"lane={lane}" in line.getMessage()
    assert line.memq_trace_id == "trace-7"  # type: ignore[attr-defined]
    key = ContextKey.create("t/5%.x", USER, None).id
    assert line.memq_key == key  # type: ignore[attr-defined]
    assert line.memq_version == 1  # type: ignore[attr-defined]


def citing_the_reply(request: dict[str, Any]) -> Reply:
    """A small model's slip: the user's fact cites the assistant's reply (m2) beside it."""
    fact = {
        "content": fact_for("item-1"),
        "category": "context",
        "confidence": 0.9,
        "cites": ["m2"],
    }
    body = {"user": {}, "history": {}, "newFacts": [fact], "factsToRemove": []}
    return Reply(content=json.dumps(body))


@pytest.mark.parametrize("lane", LANES)
def test_both_lanes_move_a_citation_of_the_reply_to_the_users_message(
    lane: str, make_settings: Any, openai_server: ScriptedOpenAI, producer_for: Any
) -> None:
    """The batch lane's parked run keeps no text: the repair reads it back from the context."""
    openai_server.responder = citing_the_reply
    settings = lane_settings_for(lane, make_settings, openai_server)
    runtime, lane_, clock = lane_for(settings)
    assert producer_for(settings).after_agent("t/5%.x", USER, None, turn("item-1"))
    answer_one_run(lane, runtime, lane_, clock, openai_server)
    (fact,) = document_of(settings, USER).facts
    (source,) = fact.sources
    assert fact.content == fact_for("item-1")
    assert (source.attribution, source.roles) == ("message", ("user",))
    assert source.excerpts == (turn("item-1")[0]["content"],)
    metrics = read_snapshot(runtime.queue.redis, settings, now_ms()).metrics
    assert (metrics["citations_repaired"], metrics["facts_refused"]) == (1, 0)


def test_memq_eval_reports_the_bill_memq_stats_shows_with_the_batch_lane_on(
    make_settings: Any, openai_server: ScriptedOpenAI, producer_for: Any
) -> None:
    """One run answered by a batch job (batch discount, cached prefix), one flushed and answered
    synchronously: `memq eval`'s extraction cost and cost per 1,000 turns are the workers' bill
    as `memq stats --json` shows it."""
    openai_server.provider = Provider(cache=PrefixCache())
    openai_server.responder = learn_items
    settings = lane_settings_for("batch", make_settings, openai_server, **PRICES)
    runtime, lane, clock = lane_for(settings)
    producer = producer_for(settings)
    assert producer.after_agent("t-batch", USER, None, turn("item-1"))
    answer_one_run("batch", runtime, lane, clock, openai_server)
    assert producer.flush("t-sync", USER, None, turn("item-2"))
    answer_one_run("sync", runtime, lane, clock, openai_server)

    redis_ = runtime.queue.redis
    stats = summarise(read_snapshot(redis_, settings, now_ms()))
    evalset = read_locomo(json.loads((EVAL_DATA / "locomo_small.json").read_text())).select(limit=1)
    prices = Prices(1.0, 2.0, 0.25)
    result = build_result(
        evalset, {}, {}, {}, read_counts(redis_, settings),
        Models("scripted", "scripted", "scripted"),
        EvalPrices(prices, prices, prices, "settings"), {},
    )  # fmt: skip
    extraction = result["extraction"]
    assert stats["batch_prompt_tokens"] > 0 and stats["prompt_tokens"] > 0  # both lanes billed
    assert extraction["cost_usd"] == pytest.approx(stats["llm_cost_usd"])
    assert extraction["cost_per_1000_turns_usd"] == pytest.approx(stats["cost_per_1000_turns_usd"])
    assert extraction["calls"] == stats["billed_runs"] == 2
    assert extraction["prompt_tokens"] == stats["prompt_tokens"] + stats["batch_prompt_tokens"]
