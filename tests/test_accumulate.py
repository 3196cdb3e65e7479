"""A pending context accumulates what it is handed: the merge rule in Python (the spool) and in
``enqueue.lua`` (Redis), checked against the same cases, and the queue-level scenarios of a
summarised history handed over before the older messages were extracted."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from memq.core.identity import ContextKey
from memq.core.keys import KeySchema, QueueKeys
from memq.core.models import ConversationContext, Message, messages_from_json, messages_to_json
from memq.core.settings import MemqSettings
from producer.accumulate import (
    extends,
    identity,
    merge_messages,
    merge_messages_json,
    merge_within,
)
from producer.enqueue import EnqueueCode, Enqueuer, EnqueueRequest
from producer.producer import MemoryProducer
from producer.spool import Spool
from worker.queue import QueueClient

T0 = 1_700_000_000_000
KEY = ContextKey.create("thread-1", "alice", None)


def msgs(*specs: str) -> list[Message]:
    """``"u:text"`` / ``"a:text"``, with ``"#id"`` at the end for a message id."""
    out = []
    for spec in specs:
        role, _, rest = spec.partition(":")
        text, _, mid = rest.partition("#")
        out.append(Message("user" if role == "u" else "assistant", text, mid or None))
    return out


# (name, older, newer, expected): the one table both implementations are held to.
CASES: list[tuple[str, list[Message], list[Message], list[Message]]] = [
    (
        "appended turn",
        msgs("u:one", "a:ok"),
        msgs("u:one", "a:ok", "u:two", "a:fine"),
        msgs("u:one", "a:ok", "u:two", "a:fine"),
    ),
    ("re-send", msgs("u:one", "a:ok"), msgs("u:one", "a:ok"), msgs("u:one", "a:ok")),
    (
        "summarised, nothing kept",
        msgs("u:I like X", "a:noted"),
        msgs("u:Summary: likes X", "u:I also like Y", "a:sure"),
        msgs("u:I like X", "a:noted", "u:Summary: likes X", "u:I also like Y", "a:sure"),
    ),
    (
        "summarised, recent turns kept",
        msgs("u:one", "a:ok 1", "u:two", "a:ok 2"),
        msgs("u:Summary", "u:two", "a:ok 2", "u:three"),
        msgs("u:one", "a:ok 1", "u:Summary", "u:two", "a:ok 2", "u:three"),
    ),
    (
        "front trimmed by the size cap",
        msgs("u:one", "a:two", "u:three", "a:four"),
        msgs("u:three", "a:four", "u:five"),
        msgs("u:one", "a:two", "u:three", "a:four", "u:five"),
    ),
    (
        "front trimmed, the dropped part kept whole",
        msgs("u:ok", "a:one", "u:two"),
        msgs("a:one", "u:two", "u:ok"),
        msgs("u:ok", "a:one", "u:two", "u:ok"),
    ),
    (
        "the turn after a merge",
        msgs("u:I like X", "a:noted", "u:Summary", "u:I like Y"),
        msgs("u:Summary", "u:I like Y", "a:sure", "u:more"),
        msgs("u:I like X", "a:noted", "u:Summary", "u:I like Y", "a:sure", "u:more"),
    ),
    (
        "last turn edited",
        msgs("u:zero", "a:ok 0", "u:I like tea", "a:tea it is"),
        msgs("u:zero", "a:ok 0", "u:I like coffee", "a:coffee it is"),
        msgs(
            "u:zero", "a:ok 0", "u:I like tea", "a:tea it is", "u:I like coffee", "a:coffee it is"
        ),
    ),
    (
        "ids identify, whatever the content",
        msgs("u:hi#m1", "a:ok#m2"),
        msgs("u:hi, edited#m1", "a:ok#m2", "u:more#m3"),
        msgs("u:hi, edited#m1", "a:ok#m2", "u:more#m3"),
    ),
    (
        "same role and content is the same message",
        msgs("u:I like X", "a:ok"),
        msgs("u:I like Y", "a:ok"),
        msgs("u:I like X", "u:I like Y", "a:ok"),
    ),
    (
        "the newer order wins",
        msgs("u:A", "u:B", "u:C", "u:D"),
        msgs("u:B", "u:Z", "u:D"),
        msgs("u:A", "u:C", "u:B", "u:Z", "u:D"),
    ),
    ("nothing stored", [], msgs("u:one", "a:ok"), msgs("u:one", "a:ok")),
]
IDS = [case[0] for case in CASES]


def contents(messages: Any) -> list[tuple[str, str, str | None]]:
    return [(m.role, m.content, m.id) for m in messages]


# --- the pure rule
_TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from('"\\\n\t\x00\u2028<>'))


@given(
    st.lists(
        st.builds(
            Message,
            st.sampled_from(["user", "assistant"]),
            _TEXT,
            st.none() | _TEXT,
            st.none() | st.integers(0, 2**53),
        ),
        max_size=5,
    )
)
def test_messages_encode_as_the_json_encoder_does(messages: list[Message]) -> None:
    # enqueue.lua finds stored lists by their bytes: the fast encoder must write exactly what
    # the standard one does (every field of to_json, in its order, compact, non-ASCII as is).
    expected = json.dumps(
        [m.to_json() for m in messages], ensure_ascii=False, separators=(",", ":")
    )
    assert messages_to_json(messages) == expected


@pytest.mark.parametrize(("name", "older", "newer", "expected"), CASES, ids=IDS)
def test_merge_messages(
    name: str, older: list[Message], newer: list[Message], expected: list[Message]
) -> None:
    assert contents(merge_messages(older, newer)) == contents(expected)
    merged = merge_messages_json(messages_to_json(older), messages_to_json(newer))
    assert contents(messages_from_json(merged)) == contents(expected)


def test_an_appended_list_is_kept_as_sent_without_decoding() -> None:
    older, newer = msgs("u:one", "a:ok"), msgs("u:one", "a:ok", "u:two")
    assert extends(messages_to_json(older), messages_to_json(newer))
    assert not extends(messages_to_json(newer), messages_to_json(older))
    assert not extends(messages_to_json(msgs("u:one")), messages_to_json(msgs("u:one!")))
    newer_json = messages_to_json(newer)
    assert merge_messages_json(messages_to_json(older), newer_json) is newer_json
    assert merge_messages_json("not json", newer_json) == newer_json


# --- the spool merges the same way
@pytest.mark.parametrize(("name", "older", "newer", "expected"), CASES, ids=IDS)
def test_the_spool_merges_two_hand_offs(
    name: str, older: list[Message], newer: list[Message], expected: list[Message]
) -> None:
    first = EnqueueRequest(KEY, messages_to_json(older), flush=True, captured_ms=T0)
    second = EnqueueRequest(KEY, messages_to_json(newer), trace_id="tr-2", captured_ms=T0 + 1)
    spool = Spool(10)
    spool.put(first)
    spool.put(second)
    (merged,) = spool.pop_batch(10)
    assert contents(messages_from_json(merged.messages_json)) == contents(expected)
    assert (merged.flush, merged.trace_id, merged.captured_ms) == (True, "tr-2", T0 + 1)
    # A replay that failed comes back older than what was spooled meanwhile: same result.
    spool.put(second)
    spool.put_back(first)
    (merged,) = spool.pop_batch(10)
    assert contents(messages_from_json(merged.messages_json)) == contents(expected)


# --- enqueue.lua holds the same rule
@pytest.fixture
def enqueue(redis_client: redis.Redis, key_prefix: str) -> Enqueuer:
    return Enqueuer(redis_client, KeySchema(key_prefix), debounce_ms=10_000, max_delay_ms=30_000)


@pytest.fixture
def q(key_prefix: str) -> QueueKeys:
    return KeySchema(key_prefix).for_context(KEY.id)


def stored_messages(client: redis.Redis, q: QueueKeys) -> list[tuple[str, str, str | None]]:
    raw = client.hget(q.context(KEY.id), "messages")
    assert isinstance(raw, str)
    return contents(messages_from_json(raw))


@pytest.mark.integration
@pytest.mark.parametrize("arrival", ["in order", "older replayed last"])
@pytest.mark.parametrize(("name", "older", "newer", "expected"), CASES, ids=IDS)
def test_enqueue_lua_merges_like_the_python_rule(
    name: str,
    older: list[Message],
    newer: list[Message],
    expected: list[Message],
    arrival: str,
    enqueue: Enqueuer,
    redis_client: redis.Redis,
    q: QueueKeys,
) -> None:
    first = EnqueueRequest(KEY, messages_to_json(older), trace_id="old", captured_ms=T0)
    second = EnqueueRequest(KEY, messages_to_json(newer), trace_id="new", captured_ms=T0 + 1)
    order = [first, second] if arrival == "in order" else [second, first]
    for request in order:
        if request.messages_json != "[]":
            enqueue(request, T0 + 10)
    assert stored_messages(redis_client, q) == contents(expected)
    # Written back in the producer's encoding, so the next turn needs no decoding either.
    assert redis_client.hget(q.context(KEY.id), "messages") == messages_to_json(expected)
    assert redis_client.hget(q.context(KEY.id), "trace_id") == "new"


@pytest.mark.integration
def test_an_appended_turn_is_stored_byte_for_byte(
    enqueue: Enqueuer, redis_client: redis.Redis, q: QueueKeys
) -> None:
    history = msgs("u:one / two \u00e9", "a:ok")
    enqueue(EnqueueRequest(KEY, messages_to_json(history)), T0)
    longer = messages_to_json([*history, *msgs("u:three")])
    enqueue(EnqueueRequest(KEY, longer), T0 + 1)
    assert redis_client.hget(q.context(KEY.id), "messages") == longer


@pytest.mark.integration
def test_over_the_pending_cap_the_context_is_due_at_once(
    redis_client: redis.Redis, key_prefix: str, q: QueueKeys
) -> None:
    enqueue = Enqueuer(
        redis_client,
        KeySchema(key_prefix),
        debounce_ms=10_000,
        max_delay_ms=30_000,
        pending_max_bytes=300,
    )
    first = enqueue(EnqueueRequest(KEY, messages_to_json(msgs("u:" + "a" * 100, "a:ok"))), T0)
    assert first.deadline_ms == T0 + 10_000  # under the cap: debounced
    summarised = messages_to_json(msgs("u:Summary", "u:" + "b" * 150, "a:fine"))
    second = enqueue(EnqueueRequest(KEY, summarised), T0 + 1_000)
    assert second.deadline_ms == T0 + 1_000  # nothing dropped, and due now
    assert len(stored_messages(redis_client, q)) == 5
    assert redis_client.zscore(q.due, KEY.id) == T0 + 1_000


# --- the queue-level scenarios
def dialogue(*texts: str) -> list[dict[str, str]]:
    out = []
    for index, text in enumerate(texts):
        out.append({"role": "user" if index % 2 == 0 else "assistant", "content": text})
    return out


def pending_text(client: redis.Redis, settings: MemqSettings) -> str:
    q = KeySchema(settings.key_prefix).for_context(KEY.id)
    raw = client.hget(q.context(KEY.id), "messages")
    return " | ".join(m.content for m in messages_from_json(raw or "[]"))


@pytest.mark.integration
def test_flush_then_a_summarised_turn_keeps_both(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    with MemoryProducer(settings) as producer:
        assert producer.flush("thread-1", "alice", None, dialogue("I like X", "noted"))
        summarised = dialogue("Summary: the user likes X", "ok", "I also like Y", "sure")
        assert producer.after_agent("thread-1", "alice", None, summarised)
    text = pending_text(redis_client, settings)
    assert "I like X" in text and "I also like Y" in text
    q = KeySchema(settings.key_prefix).for_context(KEY.id)
    stored = redis_client.hmget(q.context(KEY.id), "deadline_ms", "last_enqueued_ms")
    assert int(stored[0] or 0) <= int(stored[1] or 0)  # still due now, not debounced


@pytest.mark.integration
@pytest.mark.parametrize("where", ["in flight", "behind the user cap"])
def test_a_hand_off_while_the_context_waits_keeps_what_it_held(
    where: str, make_settings: Any, redis_client: redis.Redis
) -> None:
    settings: MemqSettings = make_settings(max_inflight_per_user=1, debounce_seconds=0.0)
    queue = QueueClient(settings, redis_client)
    with MemoryProducer(settings) as producer:
        if where == "behind the user cap":
            producer.flush("other", "alice", None, dialogue("busy", "yes"))
            assert [c.context_id for c in queue.claim().claims] != [KEY.id]
        producer.flush("thread-1", "alice", None, dialogue("I like X", "noted"))
        claims = [c for c in queue.claim().claims if c.context_id == KEY.id]
        assert bool(claims) == (where == "in flight")
        summarised = dialogue("Summary: the user likes X", "ok", "I also like Y", "sure")
        result = producer.enqueue("thread-1", "alice", None, summarised)
    assert result is not None
    expected = EnqueueCode.DEFERRED_IN_FLIGHT if claims else EnqueueCode.SCHEDULED
    assert result.code is expected
    text = pending_text(redis_client, settings)
    assert "I like X" in text and "I also like Y" in text
    context = ConversationContext.from_hash(queue.load(KEY.id))
    assert [m.content for m in context.messages][:2] == ["I like X", "noted"]


# Few distinct messages, so lists share, repeat and reorder them often.
_MESSAGE = st.builds(
    Message,
    st.sampled_from(["user", "assistant"]),
    st.sampled_from(["ok", "I like X", "I like Y", "Summary", 'a/b \u00e9 "q"\n']),
    st.sampled_from([None, None, "m1", "m2", "m3"]),
)


@pytest.mark.integration
@hsettings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    older=st.lists(_MESSAGE, min_size=1, max_size=7),
    newer=st.lists(_MESSAGE, min_size=1, max_size=7),
)
def test_lua_and_python_agree_on_any_two_lists(
    older: list[Message],
    newer: list[Message],
    enqueue: Enqueuer,
    redis_client: redis.Redis,
    q: QueueKeys,
) -> None:
    redis_client.delete(q.context(KEY.id))
    enqueue(EnqueueRequest(KEY, messages_to_json(older), captured_ms=T0), T0)
    enqueue(EnqueueRequest(KEY, messages_to_json(newer), captured_ms=T0 + 1), T0)
    expected = merge_messages(older, newer)
    assert redis_client.hget(q.context(KEY.id), "messages") == messages_to_json(expected)
    # Every message handed over is still there, and the newer list whole, in its order.
    kept = {identity(m) for m in expected}
    assert all(identity(m) in kept for m in [*older, *newer])
    held = iter(expected)
    assert all(any(m == e for e in held) for m in newer)


@pytest.mark.integration
@hsettings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    older=st.lists(_MESSAGE, min_size=1, max_size=9),
    newer=st.lists(_MESSAGE, min_size=1, max_size=9),
    max_bytes=st.integers(min_value=40, max_value=400),
)
def test_lua_and_python_agree_under_the_context_byte_cap(
    older: list[Message],
    newer: list[Message],
    max_bytes: int,
    redis_client: redis.Redis,
    key_prefix: str,
    q: QueueKeys,
) -> None:
    capped = Enqueuer(
        redis_client,
        KeySchema(key_prefix),
        debounce_ms=10_000,
        max_delay_ms=30_000,
        context_max_bytes=max_bytes,
    )
    redis_client.delete(q.context(KEY.id))
    older_json, newer_json = messages_to_json(older), messages_to_json(newer)
    held, cut_first = merge_within("[]", older_json, max_bytes)
    assert capped(EnqueueRequest(KEY, older_json, captured_ms=T0), T0).cut == cut_first
    result = capped(EnqueueRequest(KEY, newer_json, captured_ms=T0 + 1), T0)
    expected, cut = merge_within(held, newer_json, max_bytes)
    stored = redis_client.hget(q.context(KEY.id), "messages")
    assert stored == expected and result.cut == cut
    assert stored is not None and len(stored.encode()) <= max_bytes
    assert redis_client.hget(q.context(KEY.id), "cut_messages") == (
        str(cut_first + cut) if cut_first + cut else None
    )


@pytest.mark.integration
def test_lists_in_another_encoding_are_merged_by_decoding(
    enqueue: Enqueuer, redis_client: redis.Redis, q: QueueKeys
) -> None:
    def spaced(messages: list[Message]) -> str:  # json.dumps' default separators, id first
        return json.dumps([{"id": m.id, **m.to_json()} for m in messages])

    older, newer = msgs("u:I like X#m1", "a:noted#m2"), msgs("u:Summary#m3", "u:I like Y#m4")
    enqueue(EnqueueRequest(KEY, spaced(older)), T0)
    enqueue(EnqueueRequest(KEY, spaced(newer)), T0 + 1)
    assert stored_messages(redis_client, q) == contents([*older, *newer])
