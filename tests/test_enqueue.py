"""enqueue.lua against a real redis-server: merge, debounce, max-delay, flush, in-flight, dead,
isolation — with an injected ``now_ms`` so the deadline maths is exact."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import redis

from memq.core.errors import InvalidIdentifier, InvalidMessages
from memq.core.identity import ANONYMOUS_USER_ID, ContextKey
from memq.core.keys import KeySchema, QueueKeys
from memq.core.models import ConversationContext, messages_to_json
from memq.core.models import Message as M
from memq.core.settings import MemqSettings
from producer.enqueue import (
    EnqueueCode,
    Enqueuer,
    EnqueueRequest,
    compute_deadline,
    replaces_messages,
)
from producer.producer import MemoryProducer

T0 = 1_700_000_000_000
DEBOUNCE = 10_000
MAX_DELAY = 30_000
KEY = ContextKey.create("thread-1", "alice", None)


def request(text: str = "hi", **flags: Any) -> EnqueueRequest:
    messages = [M("user", text), M("assistant", "ok")]
    return EnqueueRequest(key=KEY, messages_json=messages_to_json(messages), **flags)


@pytest.fixture
def enqueue(redis_client: redis.Redis, key_prefix: str) -> Enqueuer:
    return Enqueuer(
        redis_client, KeySchema(key_prefix), debounce_ms=DEBOUNCE, max_delay_ms=MAX_DELAY
    )


@pytest.fixture
def q(key_prefix: str) -> QueueKeys:
    return KeySchema(key_prefix).for_context(KEY.id)


@pytest.mark.parametrize(
    ("now", "flush", "pending", "stored", "expected"),
    [
        (T0, False, None, None, T0 + DEBOUNCE),
        (T0, True, None, None, T0),
        (T0 + 25_000, False, T0, T0 + 28_000, T0 + MAX_DELAY),  # capped
        (T0 + 5_000, False, T0, T0, T0),  # already due: kept
        (T0 + 5_000, True, T0, T0 + 10_000, T0 + 5_000),
    ],
)
def test_compute_deadline(
    now: int, flush: bool, pending: int | None, stored: int | None, expected: int
) -> None:
    got = compute_deadline(
        now,
        debounce_ms=DEBOUNCE,
        max_delay_ms=MAX_DELAY,
        flush=flush,
        pending_since_ms=pending,
        stored_deadline_ms=stored,
    )
    assert got == expected


@pytest.mark.integration
def test_merge_accumulates_messages_and_counts_versions(
    enqueue: Enqueuer, redis_client: redis.Redis, q: QueueKeys
) -> None:
    first = enqueue(request("old", trace_id="tr-1"), T0)
    second = enqueue(request("new"), T0 + 1_000)
    assert (first.version, second.version) == (1, 2)
    assert second.code is EnqueueCode.SCHEDULED
    stored: dict[str, str] = redis_client.hgetall(q.context(KEY.id))  # type: ignore[assignment]
    ctx = ConversationContext.from_hash(stored)
    # "old" is no longer in the new list but was never extracted: it stays, before it.
    assert [m.content for m in ctx.messages] == ["old", "new", "ok"]
    assert ctx.trace_id is None  # replaced by the latest call
    assert (stored["first_enqueued_ms"], stored["last_enqueued_ms"]) == (str(T0), str(T0 + 1_000))
    # No signal flags travel with a hand-off: the worker detects them on what is new.
    assert not {"correction", "reinforcement", "flush"} & stored.keys()
    assert (ctx.thread_id, ctx.user_id, ctx.agent_name) == ("thread-1", "alice", None)


@pytest.mark.integration
def test_an_older_capture_only_adds_what_the_newer_messages_lack(
    enqueue: Enqueuer, redis_client: redis.Redis, q: QueueKeys
) -> None:
    # A spool replay (or another replica's) delivers turn 1 after turn 1+2 was stored.
    enqueue(request("turn 1 and 2", trace_id="new", captured_ms=T0 + 500), T0 + 1_000)
    late = enqueue(request("turn 1", trace_id="old", flush=True, captured_ms=T0), T0 + 2_000)
    stored: dict[str, str] = redis_client.hgetall(q.context(KEY.id))  # type: ignore[assignment]
    ctx = ConversationContext.from_hash(stored)
    # The newer list leads; the older one adds only what it lacks (its "ok" is already there).
    assert [m.content for m in ctx.messages] == ["turn 1", "turn 1 and 2", "ok"]
    assert (ctx.trace_id, stored["captured_ms"]) == ("new", str(T0 + 500))
    # Everything else still applies: the version moves, a flush is due now.
    assert late.version == 2
    assert late.deadline_ms == T0 + 2_000 == redis_client.zscore(q.due, KEY.id)
    # A later capture (or a re-send of the same one) leads the merge.
    enqueue(request("turn 3", captured_ms=T0 + 500), T0 + 3_000)
    stored_json = redis_client.hget(q.context(KEY.id), "messages") or "[]"
    assert [m["content"] for m in json.loads(stored_json)] == [
        "turn 1",
        "turn 1 and 2",
        "turn 3",
        "ok",
    ]


def test_replaces_messages_and_the_spool_merge_follow_the_later_capture() -> None:
    assert replaces_messages(T0, None) and replaces_messages(T0, T0)
    assert not replaces_messages(T0 - 1, T0)
    older = request("older", captured_ms=T0)
    newer = request("newer", flush=True, captured_ms=T0 + 1)
    for merged in (older.merged_under(newer), newer.merged_under(older)):
        contents = [m["content"] for m in json.loads(merged.messages_json)]
        assert (contents, merged.captured_ms) == (["older", "newer", "ok"], T0 + 1)
        assert merged.flush


@pytest.mark.integration
def test_debounce_moves_the_deadline(
    enqueue: Enqueuer, redis_client: redis.Redis, q: QueueKeys
) -> None:
    assert enqueue(request(), T0).deadline_ms == T0 + DEBOUNCE
    assert enqueue(request(), T0 + 4_000).deadline_ms == T0 + 4_000 + DEBOUNCE
    assert redis_client.zscore(q.due, KEY.id) == T0 + 4_000 + DEBOUNCE
    assert redis_client.hget(q.context(KEY.id), "deadline_ms") == str(T0 + 4_000 + DEBOUNCE)


@pytest.mark.integration
def test_max_delay_caps_a_thread_that_never_goes_quiet(
    enqueue: Enqueuer, redis_client: redis.Redis, q: QueueKeys
) -> None:
    for offset in (0, 9_000, 18_000, 27_000):
        result = enqueue(request(), T0 + offset)
    assert result.deadline_ms == T0 + MAX_DELAY  # not T0 + 27 s + 10 s
    assert redis_client.zscore(q.due, KEY.id) == T0 + MAX_DELAY
    # A claim forgets pending_since: the next burst gets its own cap.
    redis_client.hdel(q.context(KEY.id), "pending_since_ms", "deadline_ms")
    assert enqueue(request(), T0 + 40_000).deadline_ms == T0 + 50_000


@pytest.mark.integration
def test_flush_is_due_now_and_a_later_add_does_not_postpone_it(
    enqueue: Enqueuer, redis_client: redis.Redis, q: QueueKeys
) -> None:
    enqueue(request(), T0)
    assert enqueue(request(flush=True), T0 + 1_000).deadline_ms == T0 + 1_000
    later = enqueue(request("more"), T0 + 2_000)
    assert later.deadline_ms == T0 + 1_000
    assert redis_client.zscore(q.due, KEY.id) == T0 + 1_000
    assert redis_client.hget(q.context(KEY.id), "deadline_ms") == str(T0 + 1_000)


@pytest.mark.integration
def test_enqueue_while_in_flight_leaves_due_alone(
    enqueue: Enqueuer, redis_client: redis.Redis, q: QueueKeys
) -> None:
    redis_client.zadd(q.inflight, {KEY.id: T0 + 180_000})
    result = enqueue(request("during the run"), T0)
    assert result.code is EnqueueCode.DEFERRED_IN_FLIGHT
    assert redis_client.zscore(q.due, KEY.id) is None
    ctx = redis_client.hgetall(q.context(KEY.id))
    assert ctx["deadline_ms"] == str(T0 + DEBOUNCE)  # complete reschedules from this
    assert ctx["version"] == "1"
    assert "during the run" in ctx["messages"]


@pytest.mark.integration
def test_enqueue_of_a_dead_context_revives_it(
    enqueue: Enqueuer, redis_client: redis.Redis, q: QueueKeys
) -> None:
    enqueue(request(), T0)
    redis_client.zrem(q.due, KEY.id)
    redis_client.zadd(q.dead, {KEY.id: T0 + 1})
    redis_client.hset(q.context(KEY.id), mapping={"attempts": "5", "dead_at_ms": str(T0 + 1)})
    result = enqueue(request("new facts"), T0 + 60_000)
    assert result.code is EnqueueCode.SCHEDULED
    assert redis_client.zscore(q.dead, KEY.id) is None
    assert redis_client.zscore(q.due, KEY.id) is not None
    assert redis_client.hget(q.context(KEY.id), "attempts") == "0"


@pytest.mark.integration
def test_thread_user_agent_triples_are_separate_contexts(
    make_settings: Any, redis_client: redis.Redis, key_prefix: str
) -> None:
    settings: MemqSettings = make_settings()
    dialogue = [{"role": "user", "content": "I like tea"}, {"role": "assistant", "content": "ok"}]
    with MemoryProducer(settings) as producer:
        triples = [("t1", "alice", None), ("t1", "alice", "coder"), ("t1", "bob", None)]
        for thread, user, agent in triples:
            assert producer.after_agent(thread, user, agent, dialogue) is True
        assert producer.after_agent("t1", "alice", "Coder", dialogue) is True  # same as "coder"
    keys = KeySchema(key_prefix)
    for thread, user, agent in triples:
        ctx_id = ContextKey.create(thread, user, agent).id
        shard = keys.for_context(ctx_id)
        stored = redis_client.hgetall(shard.context(ctx_id))
        assert (stored["thread_id"], stored["user_id"], stored["agent_name"]) == (
            thread,
            user,
            agent or "",
        )
        assert redis_client.zscore(shard.due, ctx_id) is not None
    versions = [
        redis_client.hget(keys.shard(0).context(ContextKey.create(*t).id), "version")
        for t in triples
    ]
    assert versions == ["1", "2", "1"]
    assert redis_client.zcard(keys.shard(0).due) == 3


@pytest.mark.integration
def test_producer_sends_filtered_messages(
    settings: MemqSettings, redis_client: redis.Redis, key_prefix: str
) -> None:
    raw = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "That's wrong, I live in Lyon"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]},
        {"role": "tool", "content": "..."},
        {"role": "assistant", "content": "Sorry, Lyon it is. Perfect!"},
    ]
    with MemoryProducer(settings) as producer:
        result = producer.enqueue("th", None, None, raw, trace_id="trace-9")
        assert result is not None and result.version == 1
        assert producer.stats.enqueued == 1
    stored = redis_client.hgetall(KeySchema(key_prefix).shard(0).context(result.context_id))
    assert json.loads(stored["messages"]) == [
        {"role": "user", "content": "That's wrong, I live in Lyon"},
        {"role": "assistant", "content": "Sorry, Lyon it is. Perfect!"},
    ]
    assert (stored["user_id"], stored["trace_id"]) == (ANONYMOUS_USER_ID, "trace-9")
    # The signals ("That's wrong") are the worker's to detect, on what it has not extracted yet.
    assert not {"correction", "reinforcement"} & stored.keys()


@pytest.mark.integration
def test_nothing_is_enqueued_without_a_dialogue(
    settings: MemqSettings, redis_client: redis.Redis, key_prefix: str
) -> None:
    with MemoryProducer(settings) as producer:
        assert producer.enqueue("th", "u", None, [{"role": "user", "content": "hi"}]) is None
        assert producer.after_agent("th", "u", None, [{"role": "user", "content": "hi"}]) is False
        assert producer.stats.errors == 0
    assert redis_client.zcard(KeySchema(key_prefix).shard(0).due) == 0


@pytest.mark.integration
def test_bad_input_raises_from_enqueue_and_is_counted_by_after_agent(
    settings: MemqSettings,
) -> None:
    dialogue = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    with MemoryProducer(settings) as producer:
        with pytest.raises(InvalidIdentifier):
            producer.enqueue("th", "bad\x00id", None, dialogue)
        with pytest.raises(InvalidMessages):
            producer.enqueue("th", "u", None, [{"content": "no role"}])
        assert producer.after_agent("", "u", None, dialogue) is False
        assert producer.flush("th", "u", None, "not a list") is False
        assert producer.stats.errors == 2


@pytest.mark.integration
def test_long_conversations_are_bounded(
    make_settings: Any, redis_client: redis.Redis, key_prefix: str
) -> None:
    settings: MemqSettings = make_settings(producer_max_chars=1000)
    raw = [{"role": "user", "content": f"{i} " + "x" * 300} for i in range(10)]
    raw.append({"role": "assistant", "content": "done"})
    with MemoryProducer(settings) as producer:
        result = producer.enqueue("th", "u", None, raw)
    assert result is not None
    stored = json.loads(
        redis_client.hget(KeySchema(key_prefix).shard(0).context(result.context_id), "messages")
        or "[]"
    )
    # The cap counts what is sent (JSON, ids): three messages of 302 characters and "done"
    # come to more than 1,000 once encoded.
    assert [m["content"][:2] for m in stored] == ["8 ", "9 ", "do"]


@pytest.mark.integration
def test_lua_and_compute_deadline_agree(
    enqueue: Enqueuer, redis_client: redis.Redis, q: QueueKeys
) -> None:
    """A seeded random walk of enqueues, flushes and claims: the script's deadline is always
    the one :func:`compute_deadline` gives."""
    rng = random.Random(7)
    now, pending, stored = T0, None, None
    for _ in range(200):
        now += rng.choice((0, 500, 3_000, 9_000, 12_000))
        flush = rng.random() < 0.1
        if rng.random() < 0.1:  # what a claim does to the fields enqueue reads
            redis_client.hdel(q.context(KEY.id), "pending_since_ms")
            pending = None
        expected = compute_deadline(
            now,
            debounce_ms=DEBOUNCE,
            max_delay_ms=MAX_DELAY,
            flush=flush,
            pending_since_ms=pending,
            stored_deadline_ms=stored,
        )
        assert enqueue(request(flush=flush), now).deadline_ms == expected
        pending = now if pending is None else pending
        stored = expected


@pytest.mark.integration
def test_disabled_memory_enqueues_nothing(
    make_settings: Any, redis_client: redis.Redis, key_prefix: str
) -> None:
    dialogue = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    with MemoryProducer(make_settings(enabled=False)) as producer:
        assert producer.after_agent("th", "u", None, dialogue) is False
        assert producer.enqueue("th", "u", None, dialogue) is None
    assert redis_client.zcard(KeySchema(key_prefix).shard(0).due) == 0
