"""A worker that dies between its save and its settlement must not get the same messages extracted
twice (found by the 30-minute soak: a kill -9 landing right after a save left the watermark behind,
and the re-claimed run stored every fact a second time).

Real redis-server, the Redis storage, the real pipeline and openai client against the scripted
server. The worker's death is the settlement that never happens: the run saves, then nothing else
of it reaches Redis; its lease expires and the reaper hands the context to the next claim.
"""

from __future__ import annotations

import json
from itertools import count
from typing import Any

import pytest
import redis

from memq.core.identity import ContextKey
from memq.core.models import ConversationContext
from producer.enqueue import Enqueuer, EnqueueRequest
from storage import Fence, get_storage
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import update_answer
from worker.llm import OpenAIUpdateModel
from worker.pipeline import ExtractionPipeline
from worker.queue import QueueClient
from worker.runtime import WorkerRuntime
from worker.tasks import extract

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000


def test_a_run_that_saved_and_died_before_settling_is_not_extracted_again(
    make_settings: Any, redis_client: redis.Redis, openai_server: ScriptedOpenAI
) -> None:
    calls = count(1)
    # Each answer names its call, so a second extraction of the same turn would show.
    openai_server.responder = lambda request: Reply(
        content=update_answer(f"The user owns a red bicycle (call {next(calls)})")
    )
    settings = make_settings(
        storage="redis",
        llm_provider="openai",
        llm_base_url=openai_server.base_url,
        llm_api_key="sk-scripted",
        llm_max_retries=0,
        token_counting=False,
        lease_seconds=60.0,
    )
    runtime = WorkerRuntime(
        settings,
        pipeline_factory=lambda s, r: ExtractionPipeline(
            s, get_storage(s, redis=r), OpenAIUpdateModel(s)
        ),
    )
    queue: QueueClient = runtime.queue
    key = ContextKey.create("t-bike", "kit", None)
    turn = [
        {"role": "user", "content": "I own a red bicycle."},
        {"role": "assistant", "content": "Noted."},
    ]
    Enqueuer(redis_client, queue.keys, debounce_ms=0, max_delay_ms=settings.max_delay_ms)(
        EnqueueRequest(key=key, messages_json=json.dumps(turn), flush=True), T0
    )

    # The first run: claimed, started, saved ... and its worker killed before it settles.
    [first] = queue.claim(T0).claims
    assert queue.renew(first.context_id, first.token, T0)
    data, watermark = queue.load_run(first.context_id)
    report = runtime.pipeline.run(
        ConversationContext.from_hash(data),
        watermark=watermark,
        fence=Fence(first.context_id, first.token),
    )
    assert report.outcome == "updated"

    # Its lease runs out; the reaper brings the context back and another run claims it.
    assert queue.reap(T0 + settings.lease_ms + 1).requeued == 1
    [second] = queue.claim(T0 + settings.lease_ms + 2).claims
    result = extract(runtime, second.context_id, second.token, clock=lambda: T0 + 70_000)

    assert result["outcome"] == "skipped"  # nothing new since the saved run
    assert openai_server.call_count == 1
    facts = [f.content for f in get_storage(settings).load("kit").facts]
    assert facts == ["The user owns a red bicycle (call 1)"]
    assert queue.stats(T0 + 70_001)["due"] == 0
