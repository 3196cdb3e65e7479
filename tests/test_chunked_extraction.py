"""Chunked extraction: a new part larger than the conversation budget is extracted oldest chunk
first, the watermark moving only past each chunk, and ``complete`` reschedules the context due at
once for the rest — never cut, never dropped."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.models import Message, messages_to_json
from memq.core.settings import MemqSettings
from producer.enqueue import Enqueuer, EnqueueRequest
from tests.support.memory_storage import InMemoryStorage
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import ITEM, conversation_of, learn_items
from tests.support.started_queue import StartingQueue
from worker.llm import OpenAIUpdateModel
from worker.pipeline import ExtractionPipeline
from worker.queue import CompleteResult
from worker.runtime import WorkerRuntime
from worker.tasks import extract
from worker.watermark import WATERMARK_DEPTH, ChunkBudget, split_at_watermark

T0 = 1_700_000_000_000
KEY = ContextKey.create("thread-1", "alice", None)


def msgs(*specs: str) -> list[Message]:
    return [Message("user" if s[0] == "u" else "assistant", s[2:]) for s in specs]


def words(text: str) -> int:
    return len(text.split())


def numbered(count: int, words_each: int = 10) -> list[Message]:
    return [
        Message("user" if n % 2 == 0 else "assistant", f"item-{n} " + "word " * words_each, f"m{n}")
        for n in range(count)
    ]


def test_a_new_part_over_the_budget_is_extracted_oldest_chunk_first() -> None:
    messages = numbered(10)
    budget = ChunkBudget(max_tokens=40, message_max_chars=2000, count_tokens=words)
    watermark: str | None = None
    chunks: list[list[str]] = []
    while True:
        selection = split_at_watermark(messages, watermark, 2, budget)
        chunks.append([m.content.split()[0] for m in selection.new])
        watermark = selection.watermark
        if not selection.more:
            break
    assert len(chunks) > 2 and all(chunks)
    assert [item for chunk in chunks for item in chunk] == [f"item-{n}" for n in range(10)]
    # Without a budget (or when it all fits) nothing changes: one selection, the whole new part.
    whole = split_at_watermark(messages, None, 2)
    assert (len(whole.new), whole.more) == (10, False)


def test_a_message_alone_over_the_budget_is_its_own_chunk() -> None:
    messages = numbered(3, words_each=100)
    budget = ChunkBudget(max_tokens=40, message_max_chars=2000, count_tokens=words)
    selection = split_at_watermark(messages, None, 2, budget)
    assert (len(selection.new), selection.more) == (1, True)
    assert budget.oldest_fitting([Message("user", "  "), *messages]) == 2  # blank costs nothing


def test_a_chunk_that_cannot_move_the_watermark_is_not_cut() -> None:
    """Ten identical unidentified messages after a watermark of the same: a chunk would end on
    the same remembered sequence, and the next run would start from the same place for ever."""
    same = [Message("user", "ok " * 10) for _ in range(WATERMARK_DEPTH + 10)]
    remembered = split_at_watermark(same[:WATERMARK_DEPTH], None, 0).watermark
    budget = ChunkBudget(max_tokens=25, message_max_chars=2000, count_tokens=words)
    selection = split_at_watermark(same, remembered, 0, budget)
    assert selection.more is False


class Worker:
    """A real queue and enqueue script on redis-server, the real pipeline and extract task, the
    scripted OpenAI server (one fact per ``item-<n>`` in the conversation)."""

    def __init__(self, settings: MemqSettings, client: redis.Redis, server: ScriptedOpenAI):
        self.settings, self.server = settings, server
        self.storage = InMemoryStorage()
        self.runtime = WorkerRuntime(
            settings,
            pipeline_factory=lambda s, r: ExtractionPipeline(s, self.storage, OpenAIUpdateModel(s)),
        )
        self.queue = self.runtime.queue
        self.enqueue = Enqueuer(
            client,
            KeySchema(settings.key_prefix),
            debounce_ms=settings.debounce_ms,
            max_delay_ms=settings.max_delay_ms,
            pending_max_bytes=settings.pending_max_bytes,
        )
        server.responder = learn_items

    def hand_over(self, now: int, messages: list[Message], *, flush: bool = False) -> None:
        self.enqueue(EnqueueRequest(KEY, messages_to_json(messages), flush=flush), now)

    def run(self, now: int) -> str:
        claims = self.queue.claim(now).claims
        assert [c.context_id for c in claims] == [KEY.id]
        (claim,) = claims
        done = extract(self.runtime, claim.context_id, claim.token, clock=lambda: now)
        return str(done["queue"])

    def items_per_call(self) -> list[list[str]]:
        return [sorted(set(ITEM.findall(conversation_of(r)))) for r in self.server.requests]


@pytest.fixture
def worker(make_settings: Any, redis_client: redis.Redis, openai_server: ScriptedOpenAI) -> Worker:
    settings = make_settings(
        llm_provider="openai",
        llm_base_url=openai_server.base_url,
        llm_max_retries=0,
        token_counting=False,
        conversation_max_tokens=200,
        debounce_seconds=10.0,
        max_delay_seconds=30.0,
    )
    return Worker(settings, redis_client, openai_server)


@pytest.mark.integration
def test_a_context_over_the_budget_is_run_again_at_once_until_all_is_extracted(
    worker: Worker,
) -> None:
    worker.hand_over(T0, numbered(12, words_each=40), flush=True)
    outcomes = [worker.run(T0)]
    while outcomes[-1] == "rescheduled":
        assert len(outcomes) < 20
        outcomes.append(worker.run(T0 + len(outcomes)))  # due at once: no debounce between
    assert outcomes[-1] == "done" and len(outcomes) > 2
    calls = worker.items_per_call()
    assert len(calls) == len(outcomes)
    assert sorted(i for call in calls for i in call) == sorted(f"item-{n}" for n in range(12))


@pytest.mark.integration
def test_a_summarised_hand_off_during_a_run_is_extracted_by_the_next(worker: Worker) -> None:
    summary = Message("user", "Summary of the conversation so far")

    def summarise_meanwhile(request: dict[str, Any]) -> Reply:
        if len(worker.server.requests) == 1:  # the agent summarises while the model answers
            worker.hand_over(T0 + 5, [summary, *numbered(6)[4:]])
        return learn_items(request)

    worker.server.responder = summarise_meanwhile
    worker.hand_over(T0, numbered(4), flush=True)
    assert worker.run(T0) == "rescheduled"
    assert worker.run(T0 + 20_000) == "done"
    assert worker.items_per_call() == [
        ["item-0", "item-1", "item-2", "item-3"],
        ["item-4", "item-5"],
    ]


@pytest.mark.integration
def test_complete_with_more_reschedules_due_now_even_if_the_version_did_not_move(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings: MemqSettings = make_settings(debounce_seconds=10.0, max_delay_seconds=30.0)
    queue = StartingQueue(settings, redis_client)
    enqueue = Enqueuer(
        redis_client, queue.keys, debounce_ms=settings.debounce_ms, max_delay_ms=30_000
    )
    q = queue.keys.for_context(KEY.id)
    for more, expected in ((True, CompleteResult.RESCHEDULED), (False, CompleteResult.DONE)):
        enqueue(EnqueueRequest(KEY, messages_to_json(msgs("u:one", "a:ok")), flush=True), T0)
        (claim,) = queue.claim(T0).claims
        settled = queue.complete(KEY.id, claim.token, T0 + 50, watermark='["x"]', more=more)
        assert settled is expected
        if more:  # the rest is due at once, the attempt count fresh, the watermark stored
            assert redis_client.zscore(q.due, KEY.id) == T0 + 50
            assert queue.load(KEY.id)["attempts"] == "0"
            assert queue.watermark(KEY.id) == '["x"]'
            (claim,) = queue.claim(T0 + 50).claims
            assert queue.complete(KEY.id, claim.token, T0 + 60) is CompleteResult.DONE
    assert queue.load(KEY.id) == {}
