"""Every size is bounded: the per-user in-flight cap, the claim's cost for a capped tenant, the
hand-off's and the context's byte caps, against a real redis-server."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.models import Message
from memq.core.settings import MemqSettings
from producer import MemoryProducer
from producer.bounds import MAX_MESSAGE_ID_CHARS, bound_hand_off
from producer.enqueue import Enqueuer, EnqueueRequest, build_request
from producer.messages import filter_messages_for_memory, has_minimum_dialogue
from tests.support.started_queue import StartingQueue
from worker.queue import Claim, CompleteResult
from worker.tick import run_tick

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000


def enqueuer(settings: MemqSettings, client: redis.Redis) -> Enqueuer:
    return Enqueuer(
        client,
        KeySchema(settings.key_prefix, settings.shards),
        debounce_ms=settings.debounce_ms,
        max_delay_ms=settings.max_delay_ms,
        retention_ms=settings.context_retention_ms,
        context_max_bytes=settings.context_max_bytes,
    )


def hand_off(enqueue: Enqueuer, key: ContextKey, now: int, messages: list[dict[str, str]]) -> Any:
    payload = json.dumps(messages, ensure_ascii=False, separators=(",", ":"))
    return enqueue(EnqueueRequest(key=key, messages_json=payload, flush=True), now)


def test_a_users_in_flight_cap_is_not_divided_by_the_shard_count(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    # One (user, agent) always lives in one shard, so dividing the cap by 64 shards left a user
    # one run at a time instead of 16.
    settings = make_settings(shards=64, max_inflight_per_user=16, max_inflight=2000)
    queue, enqueue = StartingQueue(settings, redis_client), enqueuer(settings, redis_client)
    for i in range(20):
        hand_off(
            enqueue,
            ContextKey.create(f"t{i}", "alice", "writer"),
            T0,
            [{"role": "user", "content": f"turn {i}"}, {"role": "assistant", "content": "ok"}],
        )

    claimed = queue.claim(T0 + 1).claims

    assert len(claimed) == 16


# --- the private Redis of `memq up` has a memory ceiling


def test_maxmemory_defaults_to_a_quarter_of_the_ram_and_can_be_set() -> None:
    from memq.local.redis_server import maxmemory_bytes_for

    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert maxmemory_bytes_for(None) == ram // 4
    assert maxmemory_bytes_for(512) == 512 * 2**20


@pytest.mark.integration
def test_memq_ups_redis_refuses_writes_past_maxmemory_instead_of_growing(tmp_path: Path) -> None:
    from memq.local.options import StackOptions
    from memq.local.stack import Stack

    settings = MemqSettings(data_dir=tmp_path / "data", redis_maxmemory_mb=64)
    stack = Stack(settings, StackOptions(worker=False, beat=False, flower=False)).start()
    try:
        client = redis.Redis.from_url(stack.redis_url)
        memory = client.info("memory")
        assert memory["maxmemory"] == 64 * 2**20
        assert memory["maxmemory_policy"] == "noeviction"
        client.close()
    finally:
        stack.stop()


# --- one hand-off is bounded as it is sent: ids, JSON and the number of messages count


def stored_messages(client: redis.Redis, settings: MemqSettings, context_id: str) -> list[Any]:
    keys = KeySchema(settings.key_prefix, settings.shards)
    raw = client.hget(keys.for_context(context_id).context(context_id), "messages")
    return json.loads(raw or "[]")  # type: ignore[no-any-return]


def test_a_huge_message_id_is_stored_as_a_fixed_length_digest(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings()
    huge = "id-" + "x" * 10_000_000
    turn = [
        {"role": "user", "content": "I live in Lyon", "id": huge},
        {"role": "assistant", "content": "Noted", "id": "auth0|abc"},
    ]
    with MemoryProducer(settings) as producer:
        first = producer.enqueue("th", "alice", None, turn)
        again = producer.enqueue("th", "alice", None, turn)  # the same turn, sent again
    assert first is not None and again is not None
    stored = stored_messages(redis_client, settings, first.context_id)
    assert [m["content"] for m in stored] == ["I live in Lyon", "Noted"]  # recognised: once
    assert len(stored[0]["id"]) == 36 and stored[0]["id"].startswith("sha:")
    assert stored[1]["id"] == "auth0|abc"  # an ordinary id is kept as it is
    key = KeySchema(settings.key_prefix).for_context(first.context_id).context(first.context_id)
    assert redis_client.memory_usage(key) < 10_000


def test_ids_and_json_count_against_the_hand_off_cap(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings(producer_max_chars=10_000)
    # Short contents, long ids and text that escapes (quotes, newlines, control characters):
    # the content alone is 2,000 characters, what Redis would receive is many times that.
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": '"\n\x01' * 5, "id": "m" * 120}
        for i in range(100)
    ]
    with MemoryProducer(settings) as producer:
        result = producer.enqueue("th", "alice", None, turns)
    assert result is not None
    keys = KeySchema(settings.key_prefix).for_context(result.context_id)
    raw = redis_client.hget(keys.context(result.context_id), "messages") or ""
    assert len(raw) <= 10_000
    assert json.loads(raw)[-1] == turns[-1]  # the newest are the ones kept


def test_messages_per_hand_off_are_capped(make_settings: Any, redis_client: redis.Redis) -> None:
    settings = make_settings(producer_max_messages=50)
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": str(i)} for i in range(100_000)
    ]
    with MemoryProducer(settings) as producer:
        result = producer.enqueue("th", "alice", None, turns)
    assert result is not None
    stored = stored_messages(redis_client, settings, result.context_id)
    assert [m["content"] for m in stored] == [str(i) for i in range(99_950, 100_000)]


def test_a_long_question_followed_by_its_answer_keeps_its_tail(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings(producer_max_chars=10_000)
    question = "x" * 50_000 + " so: I am allergic to peanuts"
    turn = [{"role": "user", "content": question}, {"role": "assistant", "content": "Noted."}]
    with MemoryProducer(settings) as producer:
        result = producer.enqueue("th", "alice", None, turn)
    assert result is not None
    stored = stored_messages(redis_client, settings, result.context_id)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[0]["content"].endswith("I am allergic to peanuts")
    assert len(json.dumps(stored, separators=(",", ":"))) <= 10_000


# --- one context is bounded in Redis, before the script decodes anything

CAPPED = {"producer_max_chars": 1000, "pending_max_bytes": 10_000, "context_max_bytes": 10_000}


def summarised_turn(n: int) -> list[dict[str, str]]:
    # Each hand-off holds only the new turn (the agent summarised the rest away), so the
    # context keeps accumulating until a worker extracts it.
    return [
        {"role": "user", "content": f"turn {n}: " + "é" * 150},
        {"role": "assistant", "content": f"answer {n}"},
    ]


def test_a_context_past_its_byte_cap_keeps_its_newest_messages_and_counts_the_cut(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings(**CAPPED)
    enqueue = enqueuer(settings, redis_client)
    key = ContextKey.create("th", "alice", None)
    cut = 0
    for n in range(200):
        cut += hand_off(enqueue, key, T0 + n, summarised_turn(n)).cut

    stored = stored_messages(redis_client, settings, key.id)
    raw = json.dumps(stored, ensure_ascii=False, separators=(",", ":"))
    assert len(raw.encode()) <= 10_000
    assert stored[-2:] == summarised_turn(199)  # the newest turn whole
    numbers = [int(m["content"].split()[1].rstrip(":")) for m in stored]
    assert numbers == sorted(numbers) and numbers[-1] == 199  # a contiguous newest part
    fields = redis_client.hmget(
        KeySchema(settings.key_prefix).for_context(key.id).context(key.id),
        ["cut_messages", "cut_bytes"],
    )
    assert int(fields[0] or 0) == cut == 400 - len(stored)
    assert int(fields[1] or 0) > 0


def test_a_context_already_too_big_is_cut_before_it_is_decoded(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    # A context grown to 20 MB by an earlier version: the next hand-off cuts it instead of
    # decoding it (every producer call of the shard used to wait ~50 ms on it).
    settings = make_settings(**CAPPED)
    key = ContextKey.create("th", "alice", None)
    huge = [m for n in range(40_000) for m in summarised_turn(n)]
    ctx = KeySchema(settings.key_prefix).for_context(key.id).context(key.id)
    encoded = json.dumps(huge, ensure_ascii=False, separators=(",", ":"))
    redis_client.hset(ctx, mapping={"messages": encoded})
    result = hand_off(enqueuer(settings, redis_client), key, T0, summarised_turn(40_000))

    raw = redis_client.hget(ctx, "messages") or ""
    stored = json.loads(raw)
    assert len(raw.encode()) <= 10_000 and stored[-2:] == summarised_turn(40_000)
    assert len(stored) > 20  # the newest part of the old list is kept too
    assert result.cut == 80_002 - len(stored)


def test_a_context_rescheduled_after_its_run_stays_within_the_cap_and_the_worker_says_so(
    make_settings: Any, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(**CAPPED)
    queue, enqueue = StartingQueue(settings, redis_client), enqueuer(settings, redis_client)
    key = ContextKey.create("th", "alice", None)
    hand_off(enqueue, key, T0, summarised_turn(0))
    (claim,) = queue.claim(T0 + 1).claims
    for n in range(1, 100):  # the thread goes on while the run is out
        hand_off(enqueue, key, T0 + 1 + n, summarised_turn(n))
    assert queue.complete(key.id, claim.token, T0 + 200) is CompleteResult.RESCHEDULED

    (again,) = queue.claim(T0 + 300).claims
    with caplog.at_level(logging.WARNING, logger="memq.queue"):
        data, _ = queue.load_run(again.context_id)
    raw = data["messages"]
    assert len(raw.encode()) <= 10_000 and json.loads(raw)[-2:] == summarised_turn(99)
    cut = int(data["cut_messages"])
    assert cut == 200 - len(json.loads(raw))
    [line] = [r.getMessage() for r in caplog.records if r.name == "memq.queue"]
    assert f"{cut} messages" in line and "é" not in line  # counts, never the text


def test_a_context_cut_to_its_byte_cap_is_counted_once_where_operators_look(
    make_settings: Any,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Hitting the per-context byte cap is never a silent drop: the messages cut are added to the
    metrics hash (``memq stats``, the exporter) by the run that sees them, once, however many
    times the context is loaded (a retried run neither counts nor warns again)."""
    from prometheus_client.exposition import generate_latest

    from memq.cli import main
    from memq.core.metrics import read_snapshot
    from memq.server.exporter import build_registry

    settings = make_settings(**CAPPED)
    queue, enqueue = StartingQueue(settings, redis_client), enqueuer(settings, redis_client)
    key = ContextKey.create("th", "alice@example.com", None)
    for n in range(100):
        hand_off(enqueue, key, T0 + n, summarised_turn(n))
    (claim,) = queue.claim(T0 + 200).claims
    with caplog.at_level(logging.WARNING, logger="memq.queue"):
        data, _ = queue.load_run(claim.context_id)
        queue.load_run(claim.context_id)  # the same run, retried
    cut = int(data["cut_messages"])
    assert cut > 0
    assert len([r for r in caplog.records if r.name == "memq.queue"]) == 1
    assert read_snapshot(redis_client, settings, 0).metrics["context_messages_cut"] == cut

    exposed = generate_latest(build_registry(settings, redis_client)).decode()
    assert f"memq_context_messages_cut_total {cut}.0" in exposed
    for name in ("redis_url", "key_prefix"):
        monkeypatch.setenv(f"MEMQ_{name.upper()}", str(getattr(settings, name)))
    capsys.readouterr()
    assert main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["context_messages_cut"] == cut
    assert main(["stats"]) == 0
    [row] = [r for r in capsys.readouterr().out.splitlines() if "context_max_bytes" in r]
    assert row.split() == [*["messages", "cut", "to", "context_max_bytes"], str(cut)]


# --- a tenant at its cap costs a tick little, however long its backlog


def test_a_capped_tenants_backlog_is_not_re_deferred_on_every_tick(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings(
        debounce_seconds=1.0, tick_seconds=1.0, lease_seconds=600.0, max_inflight_per_user=2
    )
    queue, enqueue = StartingQueue(settings, redis_client), enqueuer(settings, redis_client)
    dialogue = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    for i in range(3000):
        hand_off(enqueue, ContextKey.create(f"a{i}", "alice", None), T0, dialogue)
    sent: list[Claim] = []

    first = run_tick(queue, sent.append, clock=lambda: T0 + 1)
    assert len(sent) == 2 and first.deferred == 2998  # the whole backlog, once

    bob = hand_off(enqueue, ContextKey.create("b0", "bob", None), T0 + 1_500, dialogue)
    later = [run_tick(queue, sent.append, clock=lambda k=k: T0 + 1 + 1000 * k) for k in (2, 3, 4)]
    # Each later tick looks at a few of alice's keys, not at all 2,998 of them again.
    # About 2 x the cap per tick (one more where a slot falls on the tick itself).
    assert all(4 <= report.deferred <= 5 for report in later)
    assert bob.context_id in [c.context_id for c in sent]  # another tenant is not held up
    assert queue.stats(T0 + 4_001)["due"] == 2998  # nothing of alice's lost


def test_a_capped_tenants_backlog_drains_in_order_as_slots_free(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings(
        debounce_seconds=1.0, tick_seconds=1.0, lease_seconds=600.0, max_inflight_per_user=2
    )
    queue, enqueue = StartingQueue(settings, redis_client), enqueuer(settings, redis_client)
    dialogue = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    ids = [
        hand_off(enqueue, ContextKey.create(f"a{i:03}", "alice", None), T0 + i, dialogue).context_id
        for i in range(40)
    ]
    order: list[str] = []
    now = T0 + 100
    for _ in range(200):
        now += 1000
        batch = queue.claim(now)
        for claim in batch.claims:  # every run ends within its tick
            order.append(claim.context_id)
            assert queue.complete(claim.context_id, claim.token, now) is CompleteResult.DONE
        if len(order) == len(ids):
            break
    assert sorted(order) == ids  # every one extracted
    assert order[:2] == ids[:2]
    leases = KeySchema(settings.key_prefix).shard(0).user_leases
    assert not redis_client.exists(leases)  # no bookkeeping left once alice holds no lease


# --- the hand-off caps as a pure function, on hostile text

_TEXT = st.text(
    alphabet=st.sampled_from(["a", "é", '"', "\\", "\n", "\x01", "\u200b", "😀", "\ud800", "<"]),
    max_size=900,
)


@given(
    messages=st.lists(
        st.builds(
            Message,
            st.sampled_from(["user", "assistant"]),
            _TEXT,
            st.one_of(st.none(), st.text(max_size=3), st.just("auth0|" + "z" * 200)),
        ),
        max_size=30,
    ),
    max_chars=st.integers(min_value=1000, max_value=4000),
    max_messages=st.integers(min_value=2, max_value=20),
)
def test_a_hand_off_is_the_newest_messages_within_every_cap(
    messages: list[Message], max_chars: int, max_messages: int
) -> None:
    sent = bound_hand_off(messages, max_chars, max_messages)
    decoded = json.loads(sent.messages_json)
    assert len(sent.messages_json) <= max_chars and len(decoded) <= max_messages
    assert sent.messages_json.encode("utf-8")  # sendable: no lone surrogate left
    assert len(decoded) == sent.kept == len(messages) - sent.dropped
    for stored, original in zip(decoded, messages[sent.dropped :], strict=True):
        assert stored["role"] == original.role
        assert len(stored.get("id", "")) <= MAX_MESSAGE_ID_CHARS + 4
        tail = original.content.encode("utf-8", "replace").decode("utf-8")
        assert tail.endswith(stored["content"])  # a message is only ever cut to its tail


# Raw messages as agents send them: plain dicts, and dicts with every field a filtering rule reads.
_RAW_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "human", "ai", "tool", "system"]),
        "content": _TEXT | st.lists(_TEXT | st.fixed_dictionaries({"text": _TEXT}), max_size=3),
    },
    optional={
        "id": st.text(max_size=3) | st.just("auth0|" + "z" * 200),
        "tool_calls": st.sampled_from([[], [{"id": "c"}]]),
        "hidden": st.booleans(),
        "created_at": st.sampled_from(["2023-05-08T13:56:00Z", "not a time", 1_683_554_160_000]),
        "additional_kwargs": st.sampled_from(
            [{}, {"hide_from_ui": True}, {"created_at": "2023-05-08T13:56:00Z"}]
        ),
    },
)


@given(
    raw=st.lists(_RAW_MESSAGE, max_size=30),
    max_chars=st.integers(min_value=600, max_value=4000),
    max_messages=st.integers(min_value=2, max_value=20),
)
def test_the_hand_off_is_the_filtered_messages_within_the_caps_byte_for_byte(
    raw: list[dict[str, Any]], max_chars: int, max_messages: int
) -> None:
    # The producer's path takes shortcuts (plain dicts, turns within every cap); it must send
    # exactly what the general filter and bound write, so enqueue.lua finds stored lists again.
    request = build_request(
        ContextKey.create("t", "alice", None), raw, max_chars=max_chars, max_messages=max_messages
    )
    messages = filter_messages_for_memory(raw, max_chars=max_chars)
    if not has_minimum_dialogue(messages):
        assert request is None
        return
    assert request is not None
    assert request.messages_json == bound_hand_off(messages, max_chars, max_messages).messages_json
