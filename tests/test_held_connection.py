"""The producer's held connection (memq.core.connection.HeldConnection) against a real
redis-server: which clients get one, one thread at a time on it (the others through the client's
pool), a forked child on a connection of its own, the connection given back on close, and a
turn still enqueued after Redis lost its scripts."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from memq.core.connection import BUSY, HeldConnection, held_connection, redis_client
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from memq.testing.waiting import wait_for
from producer.producer import MemoryProducer

TURN = [{"role": "user", "content": "I use Go."}, {"role": "assistant", "content": "Noted."}]


@pytest.fixture
def producer_client(settings: MemqSettings) -> Iterator[redis.Redis]:
    client = redis_client(settings, socket_timeout=settings.producer_timeout_seconds)
    assert isinstance(client, redis.Redis)
    yield client
    client.close()


def _held(client: redis.Redis) -> HeldConnection:
    held = held_connection(client)
    assert held is not None
    return held


def test_only_a_client_that_makes_one_plain_try_gets_a_held_connection(
    settings: MemqSettings, producer_client: redis.Redis
) -> None:
    url = settings.redis_url
    assert held_connection(producer_client) is not None
    # redis-py's own default retries a dropped connection: its dispatch does more than one try.
    assert held_connection(redis.Redis.from_url(url)) is None
    assert held_connection(redis.Redis.from_url(url, retry=Retry(NoBackoff(), 2))) is None
    assert held_connection(redis.Redis.from_url(url, single_connection_client=True)) is None
    assert held_connection(redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0))) is not None
    # Behind Sentinels the client follows a failover with retries (built without connecting).
    behind = settings.model_copy(update={"redis_url": "redis+sentinel://127.0.0.1:1/mymaster"})
    assert held_connection(redis_client(behind, socket_timeout=0.5)) is None


def test_a_second_thread_is_told_busy_while_the_first_waits_on_the_connection(
    producer_client: redis.Redis, redis_client: redis.Redis, key_prefix: str
) -> None:
    held = _held(producer_client)
    queue = f"{key_prefix}:wake"
    replies: list[object] = []
    waiting = threading.Thread(target=lambda: replies.append(held.execute(("BLPOP", queue, 0))))
    waiting.start()
    try:
        wait_for(
            lambda: any(c.get("cmd") == "blpop" for c in redis_client.client_list()),
            what="the held connection blocked in BLPOP",
        )
        assert held.execute(("PING",)) is BUSY
        assert producer_client.ping()  # the client's pool is not held up
    finally:
        redis_client.rpush(queue, "go")
        waiting.join(timeout=60)
    assert replies == [[queue, "go"]]
    assert held.execute(("PING",)) == "PONG"
    held.close()


def test_a_forked_child_talks_on_a_connection_of_its_own(producer_client: redis.Redis) -> None:
    held = _held(producer_client)
    parent_id = held.execute(("CLIENT", "ID"))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its connection's id, never return into pytest
        code = 1
        try:
            os.write(write_end, str(held.execute(("CLIENT", "ID"))).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        child_id = int(answer.read() or "0")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_id and child_id != parent_id
    assert held.execute(("CLIENT", "ID")) == parent_id  # the parent's is still its own
    held.close()


def test_a_producer_holds_no_connection_of_a_client_it_was_given(settings: MemqSettings) -> None:
    pool = redis.BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=2,
        timeout=5,
        decode_responses=True,
        retry=Retry(NoBackoff(), 0),
    )
    shared = redis.Redis(connection_pool=pool)
    try:
        with MemoryProducer(settings, redis=shared) as producer:
            assert producer.after_agent("t-1", "alice", None, TURN)
            # Both of the caller's connections are free between calls: none is kept.
            first, second = pool.get_connection(), pool.get_connection()
            pool.release(first)
            pool.release(second)
    finally:
        shared.close()


def test_a_pool_of_one_is_left_to_the_client(settings: MemqSettings) -> None:
    one = redis_client(settings, socket_timeout=0.5, max_connections=1)
    try:
        assert held_connection(one) is None
    finally:
        one.close()


def test_closing_gives_the_held_connection_back(producer_client: redis.Redis) -> None:
    held = _held(producer_client)
    held_id = held.execute(("CLIENT", "ID"))
    assert producer_client.client_id() != held_id  # the pool's own, while it is held
    held.close()
    # The pool hands out the connection given back last: the one that was held.
    assert producer_client.client_id() == held_id


def test_a_turn_is_enqueued_after_redis_lost_its_scripts(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    with MemoryProducer(settings) as producer:
        assert producer.after_agent("t-1", "alice", None, TURN)
        redis_client.script_flush()
        assert producer.after_agent("t-2", "alice", None, TURN)
        redis_client.script_flush()
        assert producer.flush("t-2", "alice", None, TURN)
        assert producer.stats.enqueued == 3 and producer.stats.spooled == 0
    context_id = ContextKey.create("t-2", "alice", None).id
    due = KeySchema(settings.key_prefix, settings.shards).for_context(context_id).due
    assert redis_client.zscore(due, context_id) is not None


def test_a_turn_is_enqueued_on_a_new_connection_after_redis_closed_the_held_one(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    """What a Redis restart does to an idle producer: its socket is closed by the server. The
    pool's checkout noticed (a readable socket is a closed or dirty one); the held connection
    must notice too, or the first turn after every restart is lost to the fail-open path."""
    with MemoryProducer(settings) as producer:
        assert producer.after_agent("t-1", "alice", None, TURN)
        killed = redis_client.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
        assert producer.after_agent("t-2", "alice", None, TURN)
        assert producer.stats.enqueued == 2 and producer.stats.spooled == 0
    context_id = ContextKey.create("t-2", "alice", None).id
    due = KeySchema(settings.key_prefix, settings.shards).for_context(context_id).due
    assert redis_client.zscore(due, context_id) is not None
