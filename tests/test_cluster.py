"""memq on a real 3-master Redis Cluster (loopback, built by the `redis_cluster` fixture).

The same scenarios as on one node: enqueue and debounce, claim/lease/reap, fenced saves, forget,
injection, and a real Celery worker (broker on a plain Redis) extracting what a producer sent.
The shards spread evenly over the masters, and every Lua script call lands in one slot
(RedisCluster refuses a cross-slot EVALSHA, so each scenario passing shows that too).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from redis.cluster import RedisCluster

from memq.core.connection import RedisClient
from memq.core.errors import StaleClaim
from memq.core.settings import MemqSettings
from memq.local.redis_cluster import LocalCluster
from producer import MemoryProducer
from producer.injector import MemoryInjector
from storage import Fence, get_storage
from storage.document import Fact, MemoryDocument
from storage.erasure import erase
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.cluster import CLUSTER_SHARDS
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import fact_for, learn_items, queue_idle, stack_settings, turn
from tests.support.waiting import wait_for
from tests.support.world import T0, World
from worker.queue import CompleteResult, QueueClient

pytestmark = pytest.mark.integration


@pytest.fixture
def world(make_cluster_settings: Any, cluster_client: RedisClient) -> World:
    settings = make_cluster_settings(
        debounce_seconds=60.0, max_delay_seconds=600.0, lease_seconds=30.0
    )
    return World(settings, cluster_client)


def value_of(client: RedisClient, key: str) -> Any:
    kind = str(client.type(key))
    if kind == "string":
        return client.get(key)
    if kind == "hash":
        return client.hgetall(key)
    if kind == "list":
        return client.lrange(key, 0, -1)
    if kind == "set":
        return client.smembers(key)
    if kind == "zset":
        return client.zrange(key, 0, -1)
    return kind


def keys_with(client: RedisClient, prefix: str, needle: str) -> list[str]:
    """Keys of ``prefix`` (on every master) whose name or value holds ``needle``."""
    return [
        key
        for key in client.scan_iter(match=f"{prefix}:*", count=1000)
        if needle in key or needle in repr(value_of(client, key))
    ]


def test_the_client_is_a_cluster_client(cluster_client: RedisClient) -> None:
    assert isinstance(cluster_client, RedisCluster)
    assert len(cluster_client.get_primaries()) == 3


def test_enqueue_debounces_and_a_flush_makes_it_due(world: World) -> None:
    first = world.hand_off("t1", "ann", "hello")
    context_id = first.context_id
    assert (first.version, first.deadline_ms) == (1, T0 + 60_000)
    again = world.hand_off("t1", "ann", "hello again", now=T0 + 1_000)
    assert (again.version, again.deadline_ms) == (2, T0 + 61_000)
    q = world.queue.keys.for_context(context_id)
    assert world.client.zscore(q.due, context_id) == T0 + 61_000
    flushed = world.hand_off("t1", "ann", "bye", flush=True, now=T0 + 2_000)
    assert (flushed.version, flushed.deadline_ms) == (3, T0 + 2_000)
    # Every message handed over stays pending until extracted, in order.
    stored = [m["content"] for m in json.loads(world.queue.load(context_id)["messages"])]
    assert stored == ["hello", "hello again", "bye", "ok"]
    assert world.queue.claim(T0 + 1_999).claims == []
    [claim] = world.queue.claim(T0 + 2_000).claims
    assert claim.context_id == context_id
    assert world.queue.claimed_version(context_id) == 3


def test_shards_spread_evenly_over_the_masters_and_one_claim_reaches_every_shard(
    world: World, redis_cluster: LocalCluster
) -> None:
    client = world.client
    assert isinstance(client, RedisCluster)
    keys = world.queue.keys
    per_master = Counter(client.get_node_from_key(s.due).name for s in keys.all_shards())
    assert sorted(per_master.values()) == [CLUSTER_SHARDS // 3] * 3
    ids: list[str] = []
    n = 0
    while len({keys.shard_of(i) for i in ids}) < CLUSTER_SHARDS:  # work in every shard
        ids.append(world.enqueue("t", f"u{n}", f"text of u{n}", flush=True))
        n += 1

    batch = world.queue.claim(T0 + 1)

    assert sorted(c.context_id for c in batch.claims) == sorted(ids)
    stats = world.queue.stats(T0 + 2)
    assert (stats["due"], stats["inflight"]) == (0, len(ids))


def test_lease_expiry_is_reaped_and_the_old_claim_is_stale(world: World) -> None:
    queue = world.queue
    context_id = world.enqueue("t1", "bob", "remember me", flush=True)
    [first] = queue.claim(T0 + 1).claims
    assert queue.renew(context_id, first.token, T0 + 2)  # the run started
    reaped = queue.reap(T0 + 2 + world.settings.lease_ms + 1)
    assert (reaped.requeued, reaped.dead) == (1, 0)
    [second] = queue.claim(T0 + 3 + world.settings.lease_ms).claims
    assert int(second.token) > int(first.token)
    assert queue.complete(context_id, first.token, T0 + 4 + world.settings.lease_ms) is (
        CompleteResult.STALE
    )
    assert queue.complete(context_id, second.token, T0 + 5 + world.settings.lease_ms) is (
        CompleteResult.DONE
    )
    assert queue_idle(queue)


def test_a_fenced_save_of_a_lost_claim_is_refused(world: World) -> None:
    queue, storage = world.queue, world.storage
    context_id = world.enqueue("t1", "cat", "fencing", flush=True)
    [old] = queue.claim(T0 + 1).claims
    queue.reap(T0 + 2 + world.settings.lease_ms)  # its worker paused past the lease
    [new] = queue.claim(T0 + 3 + world.settings.lease_ms).claims

    def add(text: str) -> Any:
        return lambda doc: MemoryDocument(facts=[*doc.facts, Fact(content=text)])

    with pytest.raises(StaleClaim):
        storage.update("cat", None, add("from the stale run"), fence=Fence(context_id, old.token))
    storage.update("cat", None, add("from the current run"), fence=Fence(context_id, new.token))
    assert [f.content for f in storage.load("cat").facts] == ["from the current run"]


def test_forget_removes_everything_of_the_user_on_every_master(world: World) -> None:
    queue, storage, prefix = world.queue, world.storage, world.settings.key_prefix
    storage.save("fay", None, MemoryDocument(facts=[Fact(content="fay-doc-secret")]))
    storage.save("fay", "coder", MemoryDocument(facts=[Fact(content="fay-agent-secret")]))
    dead = world.enqueue("t-dead", "fay", "fay-dead-secret", flush=True)
    [claim] = queue.claim(T0 + 1).claims
    queue.fail(dead, claim.token, "PermanentLLMError: bad request", None, T0 + 2)
    running = world.enqueue("t-run", "fay", "fay-run-secret", flush=True, now=T0 + 3)
    [in_flight] = queue.claim(T0 + 4).claims
    world.enqueue("t-wait", "fay", "fay-wait-secret", now=T0 + 5)
    world.enqueue("t-gus", "gus", "gus-wait-keep", now=T0 + 6)
    assert keys_with(world.client, prefix, "fay")

    report = erase(world.settings, world.client, storage, "fay")

    assert (report.documents, report.pending, report.in_flight, report.dead) == (2, 1, 1, 1)
    with pytest.raises(StaleClaim):
        storage.update(
            "fay",
            None,
            lambda d: MemoryDocument(facts=[Fact(content="fay-late")]),
            fence=Fence(running, in_flight.token),
        )
    assert keys_with(world.client, prefix, "fay") == []
    assert keys_with(world.client, prefix, "gus-wait-keep")
    assert erase(world.settings, world.client, storage, "fay").total == 0


def test_injection_reads_the_memory_from_the_cluster(make_cluster_settings: Any) -> None:
    settings = make_cluster_settings()
    storage = get_storage(settings)  # builds its own cluster client from the URL
    storage.save("dan", None, MemoryDocument(facts=[Fact(content="Dan prefers tea")]))
    block = MemoryInjector(settings).block("dan")
    assert "Dan prefers tea" in block and block.startswith("<user_memory>")
    assert storage.list_users() == ["dan"]


def test_a_worker_extracts_what_a_producer_sent_through_the_cluster(
    make_cluster_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    cluster_client: RedisClient,
) -> None:
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(make_cluster_settings, openai_server)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_beat(env)
    queue = QueueClient(settings, cluster_client)
    users = [f"e{n}" for n in range(12)]
    with MemoryProducer(settings) as producer:
        for n, user in enumerate(users):
            assert producer.flush("t", user, None, turn(f"item-{n}"))
        assert producer.stats.spooled == 0
    storage = get_storage(settings, redis=cluster_client)

    def extracted() -> bool:
        return all(
            [f.content for f in storage.load(user).facts] == [fact_for(f"item-{n}")]
            for n, user in enumerate(users)
        )

    wait_for(extracted, interval=0.2, what="every context extracted")
    wait_for(lambda: queue_idle(queue), what="the queue idle")
    assert MemoryInjector(settings, storage).block("e3").count("item-3") == 1


def test_doctor_checks_every_master_and_refuses_the_cluster_as_broker(
    redis_cluster: LocalCluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memq.cli import main

    monkeypatch.setenv("MEMQ_REDIS_URL", redis_cluster.url)
    monkeypatch.setenv("MEMQ_SHARDS", "48")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "OK    cluster: 3 master(s), state ok, 16384/16384 slots served; 48 shard(s)" in out
    assert out.count("OK    redis 127.0.0.1:") == 3
    assert (
        "FAIL  broker: the broker cannot be a Redis Cluster (kombu has no cluster transport): "
        "set MEMQ_BROKER_URL to a plain or sentinel:// Redis"
    ) in out


def test_the_cli_works_on_the_cluster(
    make_cluster_settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Any,
) -> None:
    from memq.cli import main

    settings: MemqSettings = make_cluster_settings()
    for name in ("redis_url", "broker_url", "key_prefix", "shards", "storage"):
        monkeypatch.setenv(f"MEMQ_{name.upper()}", str(getattr(settings, name)))
    conversation = tmp_path / "c.json"
    conversation.write_text(
        json.dumps(
            [
                {"role": "user", "content": "I am Gil and I write Rust."},
                {"role": "assistant", "content": "Nice."},
            ]
        ),
        encoding="utf-8",
    )
    assert main(["enqueue", str(conversation), "--thread", "t1", "--user", "gil"]) == 0
    assert main(["facts", "add", "gil", "Gil writes Rust"]) == 0
    capsys.readouterr()
    assert main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["due"] == 1
    assert main(["inject", "gil"]) == 0
    assert "Gil writes Rust" in capsys.readouterr().out
    assert main(["forget", "gil", "--json"]) == 0
    removed = json.loads(capsys.readouterr().out)["removed"]
    assert (removed["documents"], removed["pending"]) == (1, 1)
