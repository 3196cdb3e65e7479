"""The producer fails open: with Redis stopped it returns False fast, spools, logs once, and
replays the spool when Redis is back."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer, free_port
from producer import backoff as backoff_module
from producer.enqueue import EnqueueRequest
from producer.producer import MemoryProducer
from producer.spool import Spool
from tests.support.attempts import counting_client
from tests.support.waiting import wait_for


def dialogue(user_text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user_text}, {"role": "assistant", "content": "ok"}]


def req(thread: str, text: str = "m", **flags: Any) -> EnqueueRequest:
    return EnqueueRequest(ContextKey.create(thread, "u", None), text, **flags)


# --- the spool on its own
def test_spool_coalesces_per_context_and_drops_the_oldest() -> None:
    spool = Spool(2)
    assert spool.put(req("a", "a1", flush=True)) == 0
    assert spool.put(req("b")) == 0
    assert spool.put(req("a", "a2")) == 0  # coalesced: still two contexts
    assert spool.put(req("c")) == 1  # full: "b", now the oldest, goes
    batch = spool.pop_batch(10)
    assert [(r.key.thread_id, r.messages_json) for r in batch] == [("a", "a2"), ("c", "m")]
    assert batch[0].flush  # the earlier hand-off was a flush: the merged one still is
    assert len(spool) == 0


def test_put_back_never_overrides_newer_messages() -> None:
    spool = Spool(5)
    spool.put(req("a", "newer"))
    assert spool.put_back(req("a", "older", flush=True)) == 0
    (only,) = spool.pop_batch(5)
    assert (only.messages_json, only.flush) == ("newer", True)
    assert Spool(0).put(req("a")) == 1


# --- the producer against a Redis that goes away
@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    yield server
    if server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)  # in case a test left it stopped
    server.stop()


@pytest.mark.integration
def test_outage_spools_then_replays_after_restart(
    own_redis: RedisServer,
    make_settings: Any,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="producer.producer")
    settings: MemqSettings = make_settings(redis_url=own_redis.url, producer_timeout_seconds=0.2)
    with MemoryProducer(settings) as producer:
        assert producer.after_agent("t1", "u", None, dialogue("hello")) is True
        own_redis.stop()

        assert producer.after_agent("t1", "u", None, dialogue("that's wrong")) is False
        assert producer.after_agent("t1", "u", None, dialogue("I live in Lyon")) is False
        assert producer.flush("t2", "u", "coder", dialogue("perfect!")) is False
        assert producer.spool_size == 2  # t1's two calls coalesced
        assert producer.stats.spooled == 3

        restarted = RedisServer(own_redis.data_dir, port=own_redis.port, appendonly=False)
        restarted.start()
        client = redis.Redis.from_url(own_redis.url, decode_responses=True)
        try:
            wait_for(lambda: producer.stats.replayed == 2, what="spool replay")
            keys = KeySchema(key_prefix)
            t1 = client.hgetall(keys.shard(0).context(ContextKey.create("t1", "u", None).id))
            t2_id = ContextKey.create("t2", "u", "coder").id
            t2 = client.hgetall(keys.shard(0).context(t2_id))
            due_t2 = client.zscore(keys.shard(0).due, t2_id)
        finally:
            client.close()
            restarted.stop()
    # Both spooled turns, merged: the latest list leads, what it dropped is kept before it.
    assert [m["content"] for m in json.loads(t1["messages"])] == [
        "that's wrong",
        "I live in Lyon",
        "ok",
    ]
    # The spooled flush is due as soon as it is replayed.
    assert due_t2 == int(t2["deadline_ms"]) == int(t2["last_enqueued_ms"])
    assert producer.spool_size == 0
    outages = [r for r in caplog.records if "unavailable" in r.getMessage()]
    recoveries = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert (len(outages), len(recoveries)) == (1, 1)


@pytest.mark.integration
def test_a_hung_redis_costs_one_timeout_then_nothing(
    own_redis: RedisServer, make_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A back-off longer than the test: every call after the first failure falls inside it, so
    # what the agent pays is counted in commands sent, not guessed from a stopwatch.
    monkeypatch.setattr(backoff_module, "BACKOFF_MIN_SECONDS", 600.0)
    monkeypatch.setattr(backoff_module, "BACKOFF_MAX_SECONDS", 600.0)
    settings: MemqSettings = make_settings(redis_url=own_redis.url, producer_timeout_seconds=0.2)
    client = counting_client(settings)
    agent = threading.current_thread()
    assert own_redis.process is not None
    with MemoryProducer(settings, redis=client) as producer:
        assert producer.after_agent("t", "u", None, dialogue("warm up")) is True
        os.kill(own_redis.process.pid, signal.SIGSTOP)
        try:
            sent_before = client.attempts_from(agent)
            # Returns while Redis is still frozen: the socket timeout ended the wait.
            assert producer.after_agent("t", "u", None, dialogue("one")) is False
            assert client.attempts_from(agent) == sent_before + 1
            for i in range(20):
                assert producer.after_agent(f"t{i}", "u", None, dialogue("more")) is False
            # Inside the back-off: straight to the spool, not one more command (or timeout).
            assert client.attempts_from(agent) == sent_before + 1
        finally:
            os.kill(own_redis.process.pid, signal.SIGCONT)
        assert producer.stats.spooled == 21
        assert producer.drain_spool() == 21  # back: the spool replays in one go
        assert producer.stats.replayed == 21 and producer.spool_size == 0


@pytest.mark.integration
def test_full_spool_drops_the_oldest_and_drain_spool_replays(
    make_settings: Any, tmp_path: Path, key_prefix: str
) -> None:
    port = free_port()  # nothing listens yet: connections are refused
    settings: MemqSettings = make_settings(
        redis_url=f"redis://127.0.0.1:{port}/0", spool_max_contexts=2
    )
    producer = MemoryProducer(settings)
    try:
        for thread in ("a", "b", "c"):
            assert producer.after_agent(thread, "u", None, dialogue("x")) is False
        assert producer.stats.dropped == 1
        assert producer.drain_spool() == 0  # still down: nothing replayed, nothing raised
        with RedisServer(tmp_path / "late", port=port, appendonly=False) as server:
            producer.drain_spool()  # in this thread, without waiting out the back-off
            assert producer.spool_size == 0
            producer.close()  # joins the replay thread, which may have taken a batch too
            assert producer.stats.replayed == 2
            assert producer.spool_size == 0
            client = redis.Redis.from_url(server.url, decode_responses=True)
            due = client.zrange(KeySchema(key_prefix).shard(0).due, 0, -1)
            client.close()
    finally:
        producer.close()
    assert sorted(ContextKey.from_id(str(i)).thread_id for i in due) == ["b", "c"]


def turns(*texts: str) -> list[dict[str, str]]:
    return [m for text in texts for m in dialogue(text)]


@pytest.mark.integration
def test_a_late_replay_never_overwrites_a_newer_turn(
    own_redis: RedisServer, make_settings: Any, key_prefix: str
) -> None:
    """Replica A spools turn 1 during a blip only it saw; replica B sends turns 1+2; A's replay
    must not write turn 1 back over them."""
    settings: MemqSettings = make_settings(redis_url=own_redis.url, producer_timeout_seconds=0.5)
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    try:
        with MemoryProducer(settings) as a, MemoryProducer(settings) as b:
            client.config_set("maxmemory", "1")  # Redis refuses writes (OOM) for A's call only
            try:
                assert a.after_agent("t", "u", None, turns("that's wrong: Lyon")) is False
            finally:
                client.config_set("maxmemory", "0")
            assert b.after_agent("t", "u", None, turns("that's wrong: Lyon", "Paris")) is True
            a.drain_spool()
            wait_for(lambda: a.stats.replayed == 1, what="A's replay")
        stored = client.hgetall(KeySchema(key_prefix).shard(0).context("t:u:"))
    finally:
        client.close()
    assert [m["content"] for m in json.loads(stored["messages"])] == [
        "that's wrong: Lyon",
        "ok",
        "Paris",
        "ok",
    ]
    assert stored["version"] == "2"


# A real client that fails in a way memq does not expect (not a Redis error) for one turn only:
# the fault is injected at the boundary, everything else talks to the real redis-server.
BROKEN = "I love tea, unexpectedly"


class UnexpectedlyFailingRedis(redis.Redis):
    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        if any(isinstance(arg, str) and BROKEN in arg for arg in keys_and_args):
            raise RuntimeError("an unexpected client error")
        return super().evalsha(sha, numkeys, *keys_and_args)


def failing_client(url: str) -> redis.Redis:
    return UnexpectedlyFailingRedis.from_url(url, decode_responses=True, socket_timeout=1)


@pytest.mark.integration
def test_a_lone_surrogate_is_replaced_not_a_lost_turn(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    with MemoryProducer(settings) as producer:
        assert producer.after_agent("t", "u", None, dialogue("I love \ud83d tea")) is True
    key = ContextKey.create("t", "u", None).id
    stored = redis_client.hget(
        KeySchema(settings.key_prefix).for_context(key).context(key), "messages"
    )
    assert stored is not None and "I love ? tea" in stored


@pytest.mark.integration
def test_an_unexpected_send_error_is_retried_then_dropped(settings: MemqSettings) -> None:
    with MemoryProducer(settings, redis=failing_client(settings.redis_url)) as producer:
        assert producer.after_agent("t", "u", None, dialogue(BROKEN)) is False
        wait_for(lambda: producer.stats.poisoned == 1, what="the turn dropped")
        assert producer.stats.errors == 3 and producer.spool_size == 0


@pytest.mark.integration
def test_an_unexpected_replay_error_keeps_the_rest_of_the_batch(
    make_settings: Any, tmp_path: Path, key_prefix: str
) -> None:
    port = free_port()  # nothing listens yet: every call is spooled
    settings: MemqSettings = make_settings(redis_url=f"redis://127.0.0.1:{port}/0")
    producer = MemoryProducer(settings, redis=failing_client(settings.redis_url))
    try:
        for thread, text in (("a", "tea"), ("b", BROKEN), ("c", "coffee")):
            assert producer.after_agent(thread, "u", None, dialogue(text)) is False
        with RedisServer(tmp_path / "late", port=port, appendonly=False) as server:
            producer.drain_spool()
            reader = redis.Redis.from_url(server.url, decode_responses=True)
            due = KeySchema(key_prefix).shard(0).due
            try:
                wait_for(lambda: reader.zcard(due) == 2, what="a and c replayed")
                ids = sorted(
                    ContextKey.from_id(str(i)).thread_id for i in reader.zrange(due, 0, -1)
                )
            finally:
                reader.close()
            assert ids == ["a", "c"]
            # "b" is tried a few times and then dropped, counted; never a reason to back off
            wait_for(lambda: producer.stats.poisoned == 1, what="b dropped")
            assert producer.spool_size == 0
            producer.close()
    finally:
        producer.close()
