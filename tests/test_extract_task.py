"""The `memq.extract` task body against a real redis-server, with a small in-memory pipeline in
place of the LLM: how each outcome and each error class settles the context in the queue."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from memq.core.clock import now_ms
from memq.core.errors import PermanentLLMError, ResponseParseError, TransientLLMError
from memq.core.identity import ContextKey
from memq.core.models import ConversationContext
from memq.core.settings import MemqSettings
from producer.enqueue import Enqueuer, EnqueueRequest
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import update_answer
from worker.queue import Claim, QueueClient, ReapResult
from worker.retry import backoff_ms, retry_delay_ms
from worker.runtime import WorkerRuntime
from worker.tasks import describe_args, extract

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000


@dataclass
class Report:
    outcome: str = "updated"
    facts_added: int = 1
    facts_removed: int = 0
    facts_invalid: int = 0
    facts_refused: int = 0
    citations_repaired: int = 0
    answers_missing_fields: int = 0
    removals_unknown: int = 0
    prompt_tokens: int = 120
    completion_tokens: int = 30
    duration_ms: int = 5
    changes: list[Any] = field(default_factory=list)
    watermark: str | None = None
    more: bool = False
    cached_tokens: int = 0
    service_tier: str = ""
    messages_sent: int = 1


class ScriptedPipeline:
    """Runs ``action`` for each context (raise to fail), recording what it saw."""

    def __init__(self, action: Callable[[ConversationContext], Report]) -> None:
        self.action = action
        self.seen: list[ConversationContext] = []
        self.fences: list[Any] = []

    def pending_memory(self, context_id: str) -> None:
        return None  # no storage: nothing to read with the run's start

    def run(
        self,
        context: ConversationContext,
        *,
        watermark: str | None = None,
        fence: Any = None,
        gate: Any = None,
        memory: Any = None,
    ) -> Report:
        self.seen.append(context)
        self.fences.append(fence)
        return self.action(context)


@pytest.fixture
def xsettings(make_settings: Any) -> MemqSettings:
    return make_settings(  # type: ignore[no-any-return]
        debounce_seconds=1.0,
        lease_seconds=60.0,
        max_attempts=3,
        retry_backoff_seconds=2.0,
        retry_backoff_max_seconds=30.0,
    )


class Harness:
    def __init__(self, settings: MemqSettings, client: redis.Redis) -> None:
        self.settings = settings
        self.client = client
        self.pipeline = ScriptedPipeline(lambda ctx: Report())
        self.runtime = WorkerRuntime(settings, pipeline_factory=lambda s, r: self.pipeline)  # type: ignore[arg-type,return-value]
        self.queue: QueueClient = self.runtime.queue
        self._enqueue = Enqueuer(
            client,
            self.queue.keys,
            debounce_ms=settings.debounce_ms,
            max_delay_ms=settings.max_delay_ms,
        )

    def enqueue(self, now: int, text: str = "I live in Lisbon", *, flush: bool = True) -> str:
        """Through the producer's own enqueue client, as an agent would."""
        key = ContextKey.create("thread-1", "alice", "coder")
        messages = json.dumps([{"role": "user", "content": text}])
        request = EnqueueRequest(key=key, messages_json=messages, flush=flush, trace_id="trace-7")
        self._enqueue(request, now)
        return key.id

    def claim(self, now: int) -> Claim:
        [claim] = self.queue.claim(now).claims
        return claim

    def run(self, claim: Claim, now: int) -> dict[str, Any]:
        return extract(self.runtime, claim.context_id, claim.token, clock=lambda: now)

    def due(self) -> dict[str, float]:
        return dict(self.client.zrange(self.queue.keys.shard(0).due, 0, -1, withscores=True))

    def metrics(self) -> dict[str, str]:
        return self.client.hgetall(self.queue.keys.metrics())  # type: ignore[return-value]


@pytest.fixture
def h(xsettings: MemqSettings, redis_client: redis.Redis) -> Harness:
    return Harness(xsettings, redis_client)


def test_a_successful_run_deletes_the_context_and_counts_tokens(h: Harness) -> None:
    cid = h.enqueue(T0)
    result = h.run(h.claim(T0), T0 + 10)

    assert result["outcome"] == "updated" and result["queue"] == "done"
    [seen] = h.pipeline.seen
    assert (seen.user_id, seen.agent_name, seen.thread_id) == ("alice", "coder", "thread-1")
    assert seen.messages[0].content == "I live in Lisbon" and seen.trace_id == "trace-7"
    assert h.queue.load(cid) == {}
    assert h.metrics() == {
        "extractions:updated": "1",
        "prompt_tokens": "120",
        "completion_tokens": "30",
        "billed_runs": "1",
        "turns_extracted": "1",
    }


def test_a_run_whose_metrics_cannot_be_recorded_still_settles(h: Harness) -> None:
    cid = h.enqueue(T0)
    h.client.set(h.queue.keys.metrics(), "not a hash")  # every HINCRBY now fails (WRONGTYPE)
    assert h.run(h.claim(T0), T0 + 10) == {
        "outcome": "updated",
        "facts_added": 1,
        "facts_removed": 0,
        "queue": "done",
    }
    assert h.queue.load(cid) == {}


def test_facts_dropped_as_invalid_are_counted_and_logged(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A saved answer whose new facts did not all validate says so: in the extraction's log
    line and in the metrics (they used to vanish silently)."""
    h.pipeline = ScriptedPipeline(lambda ctx: Report(facts_invalid=2))
    h.enqueue(T0)
    with caplog.at_level("INFO", logger="memq.extract"):
        h.run(h.claim(T0), T0 + 10)
    assert h.metrics()["facts_invalid"] == "2"
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("extraction")]
    assert "facts_invalid=2" in line


def test_messages_arriving_during_the_run_are_run_again(h: Harness) -> None:
    cid = h.enqueue(T0, "first")

    def enqueue_meanwhile(ctx: ConversationContext) -> Report:
        if len(h.pipeline.seen) == 1:
            h.enqueue(T0 + 20, "second", flush=False)
        return Report()

    h.pipeline.action = enqueue_meanwhile
    assert h.run(h.claim(T0), T0 + 50)["queue"] == "rescheduled"
    assert h.run(h.claim(T0 + 1_020), T0 + 1_030)["queue"] == "done"
    # The second run has both: "first" stays pending until extracted (the watermark skips it).
    assert [c.messages[-1].content for c in h.pipeline.seen] == ["first", "second"]
    assert h.queue.load(cid) == {}


def test_a_stale_token_is_a_no_op(h: Harness) -> None:
    cid = h.enqueue(T0)
    claim = h.claim(T0)
    h.queue.reap(T0 + 60_001)  # lease expired before the task started

    assert h.run(claim, T0 + 60_002) == {"outcome": "stale"}
    assert h.pipeline.seen == []
    assert h.due() == {cid: T0 + 60_001}


def test_the_lease_is_renewed_when_the_run_starts(h: Harness) -> None:
    h.enqueue(T0)
    claim = h.claim(T0)

    def check_lease(ctx: ConversationContext) -> Report:
        inflight = h.queue.keys.shard(0).inflight
        assert h.client.zscore(inflight, claim.context_id) == T0 + 30_000 + 60_000
        return Report()

    h.pipeline.action = check_lease
    assert h.run(claim, T0 + 30_000)["queue"] == "done"


def test_only_a_run_that_started_counts_an_attempt_when_its_lease_expires(h: Harness) -> None:
    cid = h.enqueue(T0)
    h.claim(T0)  # its task waits in a broker backlog past `expires`; Celery drops it
    assert h.queue.reap(T0 + 60_001) == ReapResult(requeued=1, dead=0)
    assert h.queue.load(cid).get("attempts", "0") == "0"

    claim = h.claim(T0 + 60_001)

    def worker_dies(ctx: ConversationContext) -> Report:  # the lease runs out inside the run
        h.queue.reap(T0 + 60_001 + 60_001)
        return Report()

    h.pipeline.action = worker_dies
    assert h.run(claim, T0 + 60_001)["queue"] == "stale"
    stored = h.queue.load(cid)
    assert (stored["attempts"], stored["last_error"]) == ("1", "lease expired")
    # Its save landed before the claim went stale: one extraction, under its outcome, not a
    # stale run (nothing it saved is undone).
    assert h.metrics() == {
        "extractions:updated": "1",
        "prompt_tokens": "120",
        "completion_tokens": "30",
        "billed_runs": "1",
        "turns_extracted": "1",
    }


def test_each_way_a_run_ends_is_counted_once_under_its_name(h: Harness) -> None:
    h.enqueue(T0)
    h.run(h.claim(T0), T0 + 10)  # updated

    def fails(ctx: ConversationContext) -> Report:
        raise PermanentLLMError("invalid api key")

    h.pipeline.action = fails
    h.enqueue(T0 + 20)
    h.run(h.claim(T0 + 20), T0 + 30)  # dead at once
    h.queue.dead_retry("all", T0 + 50)
    stale = h.claim(T0 + 50)
    h.queue.reap(T0 + 50 + 60_001)
    assert h.run(stale, T0 + 60_100) == {"outcome": "stale"}  # claim gone before it started
    assert h.metrics() == {
        "extractions:updated": "1",
        "extractions:dead": "1",
        "prompt_tokens": "120",
        "completion_tokens": "30",
        "billed_runs": "1",
        "turns_extracted": "1",
        "stale_runs": "1",
    }


def test_transient_errors_retry_with_backoff_honouring_retry_after(h: Harness) -> None:
    cid = h.enqueue(T0)

    def rate_limited(ctx: ConversationContext) -> Report:
        raise TransientLLMError("429 slow down", retry_after_seconds=7.0)

    h.pipeline.action = rate_limited
    assert h.run(h.claim(T0), T0 + 10)["queue"] == "retry"
    assert h.due() == {cid: T0 + 10 + 7_000}  # Retry-After beats the 2 s first backoff

    def timeout(ctx: ConversationContext) -> Report:
        raise TransientLLMError("timed out")

    h.pipeline.action = timeout
    assert h.run(h.claim(T0 + 7_010), T0 + 7_020)["queue"] == "retry"
    assert h.due() == {cid: T0 + 7_020 + 4_000}  # second failure: 2 s * 2
    assert h.queue.load(cid)["attempts"] == "2"
    assert h.metrics()["extractions:retry"] == "2"


def test_parse_errors_retry_until_max_attempts_then_dead(h: Harness) -> None:
    cid = h.enqueue(T0)

    def garbled(ctx: ConversationContext) -> Report:
        raise ResponseParseError("no JSON object in the answer")

    h.pipeline.action = garbled
    now = T0
    outcomes = []
    for _ in range(3):
        claim = h.claim(now)
        outcomes.append(h.run(claim, now)["queue"])
        now += 60_000
    assert outcomes == ["retry", "retry", "dead"]
    [entry] = h.queue.dead_list()
    assert entry.context_id == cid and "ResponseParseError" in entry.last_error
    assert (h.metrics()["extractions:retry"], h.metrics()["extractions:dead"]) == ("2", "1")


def test_permanent_errors_dead_letter_at_once_with_the_reason(h: Harness) -> None:
    cid = h.enqueue(T0)

    def unauthorised(ctx: ConversationContext) -> Report:
        raise PermanentLLMError("401 invalid api key")

    h.pipeline.action = unauthorised
    assert h.run(h.claim(T0), T0 + 10)["queue"] == "dead"
    [entry] = h.queue.dead_list()
    assert (entry.context_id, entry.attempts) == (cid, 1)
    assert "401 invalid api key" in entry.last_error


def test_unexpected_errors_are_retried_never_lost(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    cid = h.enqueue(T0)

    def bug(ctx: ConversationContext) -> Report:
        raise KeyError("oops")

    h.pipeline.action = bug
    with caplog.at_level(logging.INFO):
        assert h.run(h.claim(T0), T0 + 10)["queue"] == "retry"
    # The type only: an exception's text can quote the conversation (pydantic's does).
    assert h.queue.load(cid)["last_error"] == "KeyError"
    assert cid in h.due()
    # Where it broke is logged (a traceback), what it broke on is not.
    assert 'in bug\n    raise KeyError("oops")' in caplog.text  # the source line, not the text
    assert "builtins.KeyError: (hidden)" in caplog.text


def test_backoff_is_exponential_and_capped(xsettings: MemqSettings) -> None:
    assert [backoff_ms(n, xsettings) for n in range(6)] == [
        2_000,
        4_000,
        8_000,
        16_000,
        30_000,
        30_000,
    ]
    assert backoff_ms(0, xsettings, retry_after_seconds=12.5) == 12_500


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (PermanentLLMError("401"), None),
        (TransientLLMError("429", retry_after_seconds=12.5), 12_500),  # Retry-After honoured
        (TransientLLMError("503"), 4_000),
        (ResponseParseError("not JSON"), 4_000),
        (KeyError("oops"), 4_000),  # anything else: retried with backoff
    ],
)
def test_each_error_maps_to_its_retry_policy(
    xsettings: MemqSettings, error: Exception, expected: int | None
) -> None:
    assert retry_delay_ms(error, 1, xsettings) == expected


def test_flower_sees_identifiers_not_content() -> None:
    cid = ContextKey.create("chat:42", "alice", None).id
    assert describe_args(cid) == "thread=chat:42 user=alice agent=-"


def test_a_run_longer_than_its_lease_keeps_the_claim(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    """A slow model call outlasting several leases is not reaped under the running worker."""
    settings = make_settings(debounce_seconds=1.0, lease_seconds=0.6)
    h = Harness(settings, redis_client)
    cid = h.enqueue(now_ms())
    claim = h.claim(now_ms())
    reaped: list[ReapResult] = []

    def slow_model_call(ctx: ConversationContext) -> Report:
        end = time.monotonic() + 3 * settings.lease_seconds
        while time.monotonic() < end:  # the reaper runs on every tick meanwhile
            reaped.append(h.queue.reap(now_ms()))
            time.sleep(0.05)  # wait-ok: this is the slow call itself
        return Report()

    h.pipeline.action = slow_model_call
    result = extract(h.runtime, cid, claim.token)

    assert result["outcome"] == "updated" and result["queue"] == "done"
    assert reaped and all(r.requeued == 0 and r.dead == 0 for r in reaped)
    assert h.queue.load(cid) == {} and len(h.pipeline.seen) == 1


def test_a_run_settles_and_counts_in_one_round_trip(
    make_settings: Any, redis_server: Any, redis_client: redis.Redis
) -> None:
    """complete.lua and the run's metrics (its extraction and the held LLM figures) go to Redis
    in one pipeline: counted on the wire, through a proxy in front of the test's Redis."""
    from bench.round_trips import CountingProxy, script_names
    from memq.core.scripts import assemble

    source = assemble("worker", "complete")
    redis_client.script_load(source)  # a warm worker: the script is loaded
    names = script_names([("complete", source)])
    with CountingProxy(redis_server.port, names) as proxy:
        settings = make_settings(redis_url=proxy.url, debounce_seconds=1.0, lease_seconds=60.0)
        h = Harness(settings, redis_client)
        h.runtime.metrics.llm_request("ok", 0.2)  # held until the run's own write
        h.enqueue(T0)
        h.run(h.claim(T0), T0 + 10)
        _, counts = proxy.snapshot()
    assert counts["HINCRBY + script complete"] == 1, counts
    assert not any(label in counts for label in ("script complete", "HINCRBY"))
    assert h.metrics()["extractions:updated"] == "1"
    assert h.metrics()["llm_requests:ok"] == "1"


def test_a_run_spends_its_budget_in_its_settlement_s_round_trip(
    make_settings: Any, redis_server: Any, redis_client: redis.Redis
) -> None:
    """With a token budget set, the run's tokens are counted against it in the same pipeline
    as complete.lua and the run's metrics, not in a round trip of their own."""
    from bench.round_trips import CountingProxy, script_names
    from memq.core.scripts import assemble

    source = assemble("worker", "complete")
    redis_client.script_load(source)
    with CountingProxy(redis_server.port, script_names([("complete", source)])) as proxy:
        settings = make_settings(
            redis_url=proxy.url,
            debounce_seconds=1.0,
            lease_seconds=60.0,
            llm_budget_tokens_per_user=10_000,
        )
        h = Harness(settings, redis_client)
        h.enqueue(T0)
        claim = h.claim(T0)
        _, before = proxy.snapshot()
        assert h.run(claim, T0 + 10)["queue"] == "done"
        _, after = proxy.snapshot()
        budget = h.runtime.gates.budget
        assert budget is not None
        spent = budget.spent("alice")
    settled = after - before
    assert settled["HINCRBY + INCRBY + PEXPIRE + script complete"] == 1, settled
    assert not any("INCRBY" in label and "complete" not in label for label in settled), settled
    assert spent == (120 + 30, 120 + 30)  # the scripted run's prompt and completion tokens


def test_one_extraction_is_three_redis_round_trips(
    make_settings: Any,
    redis_server: Any,
    redis_client: redis.Redis,
    openai_server: ScriptedOpenAI,
) -> None:
    """A run of the real pipeline (Redis storage, the openai client against the scripted
    server), counted on the wire through a proxy: its start (the context, its watermark, the
    lease renewal and the memory it extracts into), its save (the index, the fenced
    compare-and-set and the watermark) and its settlement (complete.lua and its metrics) —
    for the run that creates the memory and for one that updates it. (A process's first run
    reads the memory apart: it renews its lease before the pipeline is built.)"""
    from bench.round_trips import CountingProxy, script_names
    from memq.core.scripts import assemble

    used = ("worker/renew", "storage/save_document", "worker/complete", "worker/claim_due")
    scripts = [(name, assemble(*name.split("/"))) for name in used]
    for _, source in scripts:
        redis_client.script_load(source)  # a warm worker: its scripts are loaded
    openai_server.responder = lambda request: Reply(content=update_answer("Ships billing in Go"))
    per_run: list[Counter[str]] = []
    with CountingProxy(redis_server.port, script_names(scripts)) as proxy:
        settings = make_settings(
            redis_url=proxy.url,
            storage="redis",
            llm_provider="openai",
            llm_base_url=openai_server.base_url,
            llm_api_key="sk-scripted",
            llm_max_retries=0,
            debounce_seconds=1.0,
            lease_seconds=60.0,
        )
        runtime = WorkerRuntime(settings)
        assert runtime.pipeline is not None  # built by the process's first run, after its start
        enqueue = Enqueuer(redis_client, runtime.queue.keys, debounce_ms=1000, max_delay_ms=60_000)
        key = ContextKey.create("thread/1", "alice@example.com", "coder")
        for turn in range(2):
            messages = json.dumps([{"role": "user", "content": f"I ship billing in Go ({turn})"}])
            enqueue(EnqueueRequest(key=key, messages_json=messages, flush=True), T0 + turn)
            [claim] = runtime.queue.claim(T0 + turn).claims
            _, before = proxy.snapshot()
            result = extract(runtime, claim.context_id, claim.token)
            _, after = proxy.snapshot()
            assert result["outcome"] == "updated" and result["queue"] == "done", result
            per_run.append(after - before)
    start = "GET + HGETALL + HMGET + script worker/renew"
    save = "SADD + script storage/save_document"
    settle = "HINCRBY + script worker/complete"
    assert per_run == [Counter({start: 1, save: 1, settle: 1})] * 2, per_run


def test_a_settlement_after_a_script_flush_counts_its_run_once(h: Harness) -> None:
    """A restarted Redis forgot the scripts: complete.lua is loaded and run again, the metrics
    sent beside its first attempt are not sent twice."""
    cid = h.enqueue(T0)
    claim = h.claim(T0)
    h.client.script_flush()
    assert h.run(claim, T0 + 10)["queue"] == "done"
    assert h.queue.load(cid) == {}
    assert h.metrics()["extractions:updated"] == "1"
    assert h.metrics()["prompt_tokens"] == "120"
