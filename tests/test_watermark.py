"""Incremental extraction: the watermark that marks what a thread already gave the memory.

Pure tests of the selection (what is new after the watermark, and what survives edits and
summarisation), the pipeline skipping the model when nothing is new, and the watermark's life in
Redis through the extract task: stored only by a run that succeeded and still held its claim.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from memq.core.identity import ContextKey
from memq.core.models import ConversationContext, Message
from memq.core.settings import MemqSettings
from producer.enqueue import Enqueuer, EnqueueRequest
from prompts.update_prompt import CORRECTION_HINT
from tests.support.memory_storage import InMemoryStorage
from tests.support.openai_server import EMPTY_UPDATE, Reply, ScriptedOpenAI
from worker.llm import OpenAIUpdateModel
from worker.pipeline import ExtractionPipeline
from worker.queue import CompleteResult, QueueClient
from worker.runtime import WorkerRuntime
from worker.tasks import extract
from worker.watermark import (
    WATERMARK_DEPTH,
    message_identity,
    split_at_watermark,
)

T0 = 1_700_000_000_000


def turns(first: int, last: int, *, ids: bool = True) -> list[Message]:
    """Turns ``first``..``last`` of a thread: a question and its answer each."""
    out: list[Message] = []
    for n in range(first, last + 1):
        out.append(Message("user", f"question {n}", f"u{n}" if ids else None))
        out.append(Message("assistant", f"answer {n}", f"a{n}" if ids else None))
    return out


def contents(messages: Sequence[Message]) -> list[str]:
    return [m.content for m in messages]


# --- the selection, pure


@pytest.mark.parametrize("ids", [True, False], ids=["message ids", "fingerprints"])
def test_a_growing_thread_sends_only_what_is_new_plus_context(ids: bool) -> None:
    first = split_at_watermark(turns(1, 2, ids=ids), None, 2)
    assert contents(first.new) == ["question 1", "answer 1", "question 2", "answer 2"]
    assert first.context == ()

    second = split_at_watermark(turns(1, 3, ids=ids), first.watermark, 2)
    assert contents(second.context) == ["question 2", "answer 2"]
    assert contents(second.new) == ["question 3", "answer 3"]


def test_identity_is_the_id_when_there_is_one_else_a_content_fingerprint() -> None:
    assert message_identity(Message("user", "hi", "msg-7")) == message_identity(
        Message("assistant", "other text", "msg-7")
    )
    assert message_identity(Message("user", "hi", "msg-7")) != message_identity(
        Message("user", "hi", "msg-8")
    )
    plain = message_identity(Message("user", "hi"))
    assert plain == message_identity(Message("user", "hi"))  # stable across enqueues
    assert plain != message_identity(Message("assistant", "hi"))
    assert plain != message_identity(Message("user", "hello"))
    # An id survives an edit of the text; a fingerprint does not.
    watermark = split_at_watermark([Message("user", "draft", "m1")], None, 0).watermark
    assert split_at_watermark([Message("user", "edited", "m1")], watermark, 0).new == ()


def test_the_watermark_holds_fixed_length_digests_never_raw_ids() -> None:
    # A 10 MB message id used to be kept, whole, for watermark_ttl_days.
    thread = [
        Message("user", "I live in Lyon", "x" * 10_000_000),
        Message("assistant", "Noted", "alice@example.com|run-1"),
    ]
    watermark = split_at_watermark(thread, None, 0).watermark
    assert watermark is not None and len(watermark) <= 64
    assert "alice@example.com" not in watermark
    assert split_at_watermark(thread, watermark, 0).new == ()  # still recognised


def test_a_watermark_of_raw_ids_from_before_the_digests_still_marks_the_boundary() -> None:
    old = json.dumps(["u1", "a1", "u2", "a2"])  # what earlier versions stored
    selection = split_at_watermark(turns(1, 3), old, 0)
    assert contents(selection.new) == ["question 3", "answer 3"]


def test_without_a_successful_save_the_same_messages_are_selected_again() -> None:
    """The caller stores the returned watermark only after a save: until then, nothing moves."""
    before = split_at_watermark(turns(1, 2), None, 1).watermark
    attempt = split_at_watermark(turns(1, 3), before, 1)
    retry = split_at_watermark(turns(1, 3), before, 1)  # the first attempt failed
    assert contents(retry.new) == contents(attempt.new) == ["question 3", "answer 3"]
    after = split_at_watermark(turns(1, 3), attempt.watermark, 1)
    assert after.new == ()


def test_survives_summarisation_dropping_the_front_of_the_thread() -> None:
    watermark = split_at_watermark(turns(1, 6), None, 2).watermark
    summarised = [Message("user", "Summary of the conversation so far: …", "sum-1")]
    summarised += turns(5, 8)  # turns 1-4 replaced by a summary; 7 and 8 are new
    selection = split_at_watermark(summarised, watermark, 2)
    assert contents(selection.new) == ["question 7", "answer 7", "question 8", "answer 8"]
    assert contents(selection.context) == ["question 6", "answer 6"]


def test_when_the_last_extracted_message_changed_the_newest_known_one_is_the_boundary() -> None:
    watermark = split_at_watermark(turns(1, 3, ids=False), None, 0).watermark
    regenerated = [
        *turns(1, 2, ids=False),
        Message("user", "question 3"),
        Message("assistant", "answer 3, regenerated"),
        Message("user", "question 4"),
    ]
    selection = split_at_watermark(regenerated, watermark, 0)
    assert contents(selection.new) == ["answer 3, regenerated", "question 4"]


def test_a_repeated_short_message_is_not_mistaken_for_the_boundary() -> None:
    thread = [*turns(1, 3, ids=False), Message("user", "yes"), Message("assistant", "Done.")]
    watermark = split_at_watermark(thread, None, 0).watermark
    again = [*thread, Message("user", "yes"), Message("assistant", "Done.")]
    assert contents(split_at_watermark(again, watermark, 0).new) == ["yes", "Done."]


def test_a_repeat_of_the_old_tail_after_summarisation_is_not_the_boundary() -> None:
    """Summarisation kept only the last extracted message, so the true boundary lines up with one
    remembered message; a later repeat of the old tail lines up with two, but not from the start."""
    thread = [*turns(1, 4, ids=False), Message("user", "continue"), Message("assistant", "Done.")]
    watermark = split_at_watermark(thread, None, 2).watermark
    summarised = [
        Message("user", "[summary of earlier conversation]"),
        Message("assistant", "Done."),
        Message("user", "I work at Acme as an SRE"),
        Message("assistant", "Noted."),
        Message("user", "continue"),
        Message("assistant", "Done."),
    ]
    selection = split_at_watermark(summarised, watermark, 1)
    assert contents(selection.new) == ["I work at Acme as an SRE", "Noted.", "continue", "Done."]
    assert contents(selection.context) == ["Done."]


def test_a_repeat_of_the_oldest_remembered_messages_is_not_the_boundary() -> None:
    thread = [Message("user", "yes"), Message("assistant", "Done."), *turns(1, 3, ids=False)]
    watermark = split_at_watermark(thread, None, 0).watermark
    summarised = [
        Message("user", "[summary]"),
        Message("assistant", "answer 3"),
        Message("user", "yes"),
        Message("assistant", "Done."),
    ]
    assert contents(split_at_watermark(summarised, watermark, 0).new) == ["yes", "Done."]


def test_nothing_recognised_means_everything_is_new() -> None:
    elsewhere = split_at_watermark(turns(10, 12), None, 2).watermark
    # A bare id ("a1") is not a watermark either: only a JSON list of identities is.
    for watermark in (None, elsewhere, "not json", json.dumps({"odd": 1}), "a1"):
        selection = split_at_watermark(turns(1, 2), watermark, 2)
        assert len(selection.new) == 4 and selection.context == ()


def test_the_stored_watermark_stays_small_however_long_the_thread() -> None:
    watermark = split_at_watermark(turns(1, 500), None, 2).watermark
    assert watermark is not None
    assert json.loads(watermark) == [message_identity(m) for m in turns(1, 500)[-WATERMARK_DEPTH:]]


# --- the pipeline on a selection


class Pipeline:
    def __init__(self, server: ScriptedOpenAI, **overrides: Any) -> None:
        values: dict[str, Any] = {
            "llm_provider": "openai",
            "llm_base_url": server.base_url,
            "llm_timeout_seconds": 5.0,
            "llm_max_retries": 0,
            "token_counting": False,
        }
        self.settings = MemqSettings(**{**values, **overrides})
        self.server = server
        self.pipeline = ExtractionPipeline(
            self.settings, InMemoryStorage(), OpenAIUpdateModel(self.settings)
        )

    def run(self, messages: Sequence[Message], watermark: str | None) -> Any:
        context = ConversationContext(
            key=ContextKey.create("thread-1", "alice", "coder"), messages=tuple(messages)
        )
        return self.pipeline.run(context, watermark=watermark)


def test_nothing_new_skips_the_model_and_keeps_the_watermark(
    openai_server: ScriptedOpenAI,
) -> None:
    p = Pipeline(openai_server)
    first = p.run(turns(1, 2), None)
    assert first.outcome == "unchanged" and openai_server.call_count == 1

    again = p.run(turns(1, 2), first.watermark)
    assert again.outcome == "skipped" and again.prompt_tokens == 0
    assert again.watermark == first.watermark  # the caller still completes the context
    assert openai_server.call_count == 1


def test_a_later_run_sends_what_was_not_extracted_yet(openai_server: ScriptedOpenAI) -> None:
    p = Pipeline(openai_server, context_messages=0)
    watermark = p.run(turns(1, 2), None).watermark
    report = p.run(turns(1, 4), watermark)
    assert report.messages_sent == 4
    prompt = openai_server.prompts()[-1]
    assert "question 3" in prompt and "answer 4" in prompt and "question 2" not in prompt


def test_the_prompt_separates_context_and_takes_signals_from_the_new_part_only(
    openai_server: ScriptedOpenAI,
) -> None:
    p = Pipeline(openai_server, message_max_chars=200)
    thread = [Message("user", "That's wrong, I use pnpm.", "u1"), Message("assistant", "Ok.", "a1")]
    watermark = p.run(thread, None).watermark
    assert CORRECTION_HINT in openai_server.prompts()[0]

    long_answer = "Start " + "x" * 1000 + " the conclusion"
    report = p.run(
        [*thread, Message("user", "Thanks", "u2"), Message("assistant", long_answer)], watermark
    )
    prompt = openai_server.prompts()[1]
    earlier, _, new = prompt.partition("</earlier_messages>")
    assert "<earlier_messages>" in earlier and "That's wrong" in earlier and "Ok." in earlier
    assert "User: Thanks" in new and "That's wrong" not in new
    assert "Start" in new and "the conclusion" in new  # a long message keeps head and tail
    assert CORRECTION_HINT not in prompt  # the old correction was already extracted
    assert (report.messages_sent, report.earlier_shown) == (2, 2)


# --- the watermark in Redis, through the extract task


class Worker:
    """A real queue on redis-server, the real pipeline, the scripted OpenAI server."""

    def __init__(self, settings: MemqSettings, client: redis.Redis, server: ScriptedOpenAI):
        self.settings = settings
        self.client = client
        self.server = server
        self.storage = InMemoryStorage()
        self.runtime = WorkerRuntime(
            settings,
            pipeline_factory=lambda s, r: ExtractionPipeline(s, self.storage, OpenAIUpdateModel(s)),
        )
        self.queue: QueueClient = self.runtime.queue
        self.key = ContextKey.create("thread-1", "alice", "coder")
        self._enqueue = Enqueuer(
            client,
            self.queue.keys,
            debounce_ms=0,
            max_delay_ms=settings.max_delay_ms,
        )

    def enqueue(self, now: int, messages: Sequence[Message]) -> None:
        """A flush through the producer's own enqueue client."""
        raw = json.dumps([m.to_json() for m in messages])
        self._enqueue(EnqueueRequest(key=self.key, messages_json=raw, flush=True), now)

    def run(self, now: int) -> dict[str, Any]:
        [claim] = self.queue.claim(now).claims
        return extract(self.runtime, claim.context_id, claim.token, clock=lambda: now)

    def watermark(self) -> str | None:
        return self.queue.watermark(self.key.id)


@pytest.fixture
def worker(make_settings: Any, redis_client: redis.Redis, openai_server: ScriptedOpenAI) -> Worker:
    settings = make_settings(
        llm_provider="openai",
        llm_base_url=openai_server.base_url,
        llm_max_retries=0,
        llm_timeout_seconds=5.0,
        token_counting=False,
        context_messages=1,
        lease_seconds=60.0,
        retry_backoff_seconds=1.0,
        watermark_ttl_days=7,
    )
    return Worker(settings, redis_client, openai_server)


@pytest.mark.integration
def test_the_second_run_of_a_growing_thread_sends_only_the_new_messages(worker: Worker) -> None:
    worker.enqueue(T0, turns(1, 3))
    assert worker.run(T0)["queue"] == "done"
    assert worker.watermark() is not None
    ttl_ms = worker.client.pttl(
        worker.queue.keys.for_context(worker.key.id).watermark(worker.key.id)
    )
    assert 0 < ttl_ms <= 7 * 86_400_000

    worker.enqueue(T0 + 1000, turns(1, 4))
    assert worker.run(T0 + 1000)["queue"] == "done"
    first, second = worker.server.prompts()
    assert all(f"question {n}" in first for n in (1, 2, 3))
    assert "question 1" not in second and "question 3" not in second
    assert "answer 3" in second.partition("</earlier_messages>")[0]  # the one context message
    assert "question 4" in second.partition("</earlier_messages>")[2]


@pytest.mark.integration
def test_a_failed_run_leaves_the_watermark_and_the_retry_sends_the_same(worker: Worker) -> None:
    worker.enqueue(T0, turns(1, 1))
    worker.run(T0)
    stored = worker.watermark()

    worker.enqueue(T0 + 1000, turns(1, 2))
    worker.server.script(Reply(status=500))
    assert worker.run(T0 + 1000)["queue"] == "retry"
    assert worker.watermark() == stored

    assert worker.run(T0 + 60_000)["queue"] == "done"
    failed, retried = worker.server.prompts()[1:]
    assert failed == retried and "question 2" in retried
    assert worker.watermark() != stored


@pytest.mark.integration
def test_a_run_that_lost_its_claim_cannot_move_the_watermark(worker: Worker) -> None:
    worker.enqueue(T0, turns(1, 1))
    worker.run(T0)
    stored = worker.watermark()
    worker.enqueue(T0 + 1000, turns(1, 2))

    def lease_lost_meanwhile(request: dict[str, Any]) -> Reply:
        # The worker stalled past its lease: the ticker reaped it and claimed it again.
        worker.queue.reap(T0 + 1000 + 60_001)
        assert worker.queue.claim(T0 + 1000 + 60_002).claims
        return Reply(content=EMPTY_UPDATE)

    worker.server.responder = lease_lost_meanwhile
    assert worker.run(T0 + 1000)["queue"] == "stale"
    assert worker.watermark() == stored
    # And at the script level: a wrong token never writes the watermark.
    result = worker.queue.complete(worker.key.id, "not-the-token", T0, watermark='["x"]')
    assert result is CompleteResult.STALE and worker.watermark() == stored


@pytest.mark.integration
def test_a_redelivered_context_with_nothing_new_is_completed_without_the_model(
    worker: Worker,
) -> None:
    worker.enqueue(T0, turns(1, 2))
    worker.run(T0)
    worker.enqueue(T0 + 1000, turns(1, 2))  # e.g. a flush of a thread already extracted

    result = worker.run(T0 + 1000)
    assert (result["outcome"], result["queue"]) == ("skipped", "done")
    assert worker.server.call_count == 1
    assert worker.queue.load(worker.key.id) == {}
