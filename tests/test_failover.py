"""A Redis primary dies (kill -9) and a replica takes over: fencing stays correct, nothing is lost.

* The promoted replica may have missed the primary's last writes (replication is asynchronous):
  a claim's token issued just before the crash must never be issued again, or the run holding it
  could still save over the next claim's work.
* Under a producer load with a real worker, with the data Redis managed by three Sentinels: the
  primary is killed, a replica promoted; producers never raise, every context is extracted, no
  message is lost.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from memq.core.clock import now_ms
from memq.core.connection import redis_client
from memq.core.errors import StaleClaim
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from memq.local.redis_cluster import LocalCluster, LocalSentinel, replica_in_sync
from memq.local.redis_server import RedisServer
from producer import MemoryProducer
from producer.enqueue import Enqueuer, EnqueueRequest
from storage import Fence, get_storage
from storage.document import Fact, MemoryDocument
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.cluster import planned_failover
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import fact_for, learn_items, stack_settings, turn
from tests.support.started_queue import StartingQueue
from tests.support.waiting import wait_for
from worker.queue import QueueClient

pytestmark = [pytest.mark.reliability, pytest.mark.integration]


def test_a_claim_token_lost_in_a_failover_is_never_issued_again(
    tmp_path: Path, make_settings: Any
) -> None:
    primary = RedisServer(tmp_path / "primary", appendonly=False).start()
    replica = RedisServer(
        tmp_path / "replica",
        appendonly=False,
        extra_args=("--replicaof", "127.0.0.1", str(primary.port)),
    ).start()
    try:
        wait_for(lambda: replica_in_sync(replica.port), what="replica sync")
        old = redis.Redis.from_url(primary.url, decode_responses=True)
        settings: MemqSettings = make_settings(redis_url=primary.url, storage="redis")
        key = ContextKey.create("t1", "ada", None)
        Enqueuer(old, KeySchema(settings.key_prefix), debounce_ms=0, max_delay_ms=1000)(
            EnqueueRequest(key=key, messages_json="[]", flush=True), now_ms()
        )
        assert old.wait(1, 5000) == 1  # the enqueue reached the replica
        # The replica's link drops and cannot come back (it has no password for the primary):
        # the claim made now never reaches it, as when the primary dies right after a write.
        old.config_set("requirepass", "cut-the-replica-off")
        old.client_kill_filter(_type="replica")
        [lost] = QueueClient(settings, old).claim().claims
        primary.kill()
        old.close()

        new = redis.Redis.from_url(replica.url, decode_responses=True)
        epoch = new.get(KeySchema(settings.key_prefix).shard(0).epoch)
        assert epoch is None or int(epoch) < int(lost.token)  # the replica missed that claim
        new.replicaof("NO", "ONE")  # promoted, as Sentinel or an operator would
        queue = StartingQueue(settings, new)
        [current] = queue.claim().claims

        assert current.context_id == key.id
        assert int(current.token) > int(lost.token)
        storage = get_storage(settings, redis=new)
        with pytest.raises(StaleClaim):
            storage.update(
                "ada",
                None,
                lambda d: MemoryDocument(facts=[Fact(content="from the lost claim")]),
                fence=Fence(key.id, lost.token),
            )
        storage.update(
            "ada",
            None,
            lambda d: MemoryDocument(facts=[Fact(content="from the current claim")]),
            fence=Fence(key.id, current.token),
        )
        assert [f.content for f in storage.load("ada").facts] == ["from the current claim"]
        new.close()
    finally:
        replica.stop()
        primary.stop()


def item(user: int, turn_index: int) -> str:
    return f"item-{user * 100 + turn_index}"


def conversation(user: int, upto: int) -> list[dict[str, str]]:
    """The whole thread so far, as an agent sends it after every turn."""
    return [message for n in range(upto + 1) for message in turn(item(user, n))]


class Load:
    """Agents talking in rounds: every round, each user's thread grows by one turn (one new item)
    and the whole thread is sent again, as agents do. The last rounds wait for ``failed_over``."""

    def __init__(self, producer: MemoryProducer, users: int = 6, rounds: int = 30) -> None:
        self.producer, self.users, self.rounds = producer, users, rounds
        self.done_rounds: list[int] = []
        self.errors: list[BaseException] = []
        self.failed_over = threading.Event()
        self.longest_call = 0.0  # reported, not asserted: timings belong to bench/
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for r in range(self.rounds):
                for u in range(self.users):
                    started = time.monotonic()
                    self.producer.after_agent(f"t{u}", f"s{u}", None, conversation(u, r))
                    self.longest_call = max(self.longest_call, time.monotonic() - started)
                self.done_rounds.append(r)
                if r == self.rounds - 5:
                    self.failed_over.wait(30)  # the last rounds go to the promoted replica
                time.sleep(0.03)  # wait-ok: the pace of agents talking, not a settle wait
        except BaseException as exc:  # the hook must never raise; reported below if it does
            self.errors.append(exc)

    def start(self) -> None:
        self.thread.start()
        wait_for(lambda: len(self.done_rounds) >= 8, what="agents under way")

    def finish(self) -> None:
        self.failed_over.set()
        self.thread.join(60)
        assert not self.thread.is_alive() and not self.errors, self.errors
        assert self.done_rounds == list(range(self.rounds))
        print(f"longest producer call: {self.longest_call:.3f} s; {self.producer.stats}")

    def check_everything_extracted(self, settings: MemqSettings) -> None:
        """Every item of every thread ends up a fact, once; nothing dropped, nothing dead."""
        storage = get_storage(settings)
        users, rounds = self.users, self.rounds
        expected = {u: {fact_for(item(u, n)) for n in range(rounds)} for u in range(users)}

        def missing() -> dict[int, int]:
            found = {u: {f.content for f in storage.load(f"s{u}").facts} for u in range(users)}
            return {u: len(expected[u] - found[u]) for u in range(users) if expected[u] - found[u]}

        wait_for(lambda: not missing(), interval=0.25, what="every turn extracted")
        for u in range(users):
            contents = [f.content for f in storage.load(f"s{u}").facts]
            assert Counter(contents).most_common(1)[0][1] == 1, u  # no fact twice
            assert set(contents) == expected[u]
        assert self.producer.stats.dropped == 0
        assert self.producer.stats.spooled > 0  # the outage was seen, and ridden out
        queue = QueueClient(settings, storage.redis)  # type: ignore[attr-defined]

        def idle() -> bool:
            stats = queue.stats()
            return stats["due"] + stats["inflight"] == 0

        wait_for(idle, what="the queue idle")
        assert queue.stats()["dead"] == 0


def failover_settings(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    redis_url: str,
    broker_url: str,
    **extra: Any,
) -> MemqSettings:
    return stack_settings(  # type: ignore[no-any-return]
        make_settings,
        openai_server,
        redis_url=redis_url,
        broker_url=broker_url,  # the broker stays up: this is the data Redis failing
        storage="redis",
        lease_seconds=5.0,
        producer_timeout_seconds=0.2,
        **extra,
    )


def kill_the_primary_under_load(
    deployment: LocalSentinel, settings: MemqSettings, celery_procs: CeleryProcs, producer_for: Any
) -> None:
    """A worker and beat on ``settings``, agents talking, the Sentinel primary killed -9: once
    the replica is promoted and the load is over, every turn must have been extracted once."""
    assert deployment.primary is not None
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=4)
    celery_procs.start_beat(env)
    load = Load(producer_for(settings))
    load.start()
    old_port = deployment.primary.port
    deployment.primary.kill()
    wait_for(
        lambda: deployment.master_port() != old_port,
        interval=0.1,
        what="the Sentinels promoting the replica",
    )
    load.finish()
    load.check_everything_extracted(settings)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sentinel_failover_under_load_loses_nothing(
    tmp_path: Path,
    make_settings: Any,
    redis_server: RedisServer,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
) -> None:
    openai_server.responder = learn_items
    with LocalSentinel(tmp_path / "sentinel") as deployment:
        assert deployment.primary is not None
        settings = failover_settings(make_settings, openai_server, deployment.url, redis_server.url)
        kill_the_primary_under_load(deployment, settings, celery_procs, producer_for)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_cluster_master_failover_under_load_loses_nothing(
    tmp_path: Path,
    make_settings: Any,
    redis_server: RedisServer,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
) -> None:
    openai_server.responder = learn_items
    with LocalCluster(tmp_path / "cluster", masters=3, replicas=1) as cluster:
        settings = failover_settings(
            make_settings, openai_server, cluster.url, redis_server.url, shards=12
        )
        env = memq_env(settings)
        celery_procs.start_worker(env, concurrency=4)
        celery_procs.start_beat(env)
        load = Load(producer_for(settings))
        load.start()
        victim, [heir] = cluster.masters[0], cluster.replicas_of[0]
        victim.kill()
        wait_for(lambda: cluster.is_master(heir), what="the replica promoted")
        wait_for(lambda: cluster.state_ok(heir.port), what="the cluster healed")
        load.finish()
        load.check_everything_extracted(settings)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_broker_follows_a_sentinel_managed_data_redis_across_a_failover(
    tmp_path: Path,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
) -> None:
    """No MEMQ_BROKER_URL with `redis+sentinel://`: Celery uses the same master through its
    sentinel:// transport, and finds the promoted replica after the primary dies."""
    openai_server.responder = learn_items
    with LocalSentinel(tmp_path / "sentinel") as deployment:
        assert deployment.primary is not None
        settings = failover_settings(make_settings, openai_server, deployment.url, "")
        settings = settings.model_copy(update={"broker_url": None})
        assert settings.broker.url.startswith("sentinel://127.0.0.1:")
        kill_the_primary_under_load(deployment, settings, celery_procs, producer_for)


def test_while_a_master_fails_over_the_other_masters_shards_are_still_claimed(
    tmp_path: Path, make_settings: Any
) -> None:
    with LocalCluster(tmp_path / "cluster", masters=3, replicas=1) as cluster:
        settings: MemqSettings = make_settings(redis_url=cluster.url, shards=12)
        client = redis_client(settings)
        queue = QueueClient(settings, client)
        enqueue = Enqueuer(
            client, KeySchema(settings.key_prefix, 12), debounce_ms=0, max_delay_ms=1000
        )
        ids = []
        for n in range(60):
            key = ContextKey.create("t", f"w{n}", None)
            enqueue(EnqueueRequest(key=key, messages_json="[]", flush=True), now_ms())
            ids.append(key.id)
        assert queue.claim(limit=1).claims  # a running ticker: its scripts are loaded everywhere
        ids = [i for i in ids if client.hget(queue.keys.for_context(i).claims, i) is None]
        victim, [heir] = cluster.masters[0], cluster.replicas_of[0]
        victim_id = cluster.node_id(victim)
        down = {
            i
            for i in ids
            if client.get_node_from_key(queue.keys.for_context(i).due).name
            == f"127.0.0.1:{victim.port}"
        }
        assert down and len(down) < len(ids)
        victim.kill()

        during = {c.context_id for c in queue.claim().claims}  # no exception: others served

        assert during == set(ids) - down or during == set(ids)  # (promoted already: all)
        wait_for(lambda: cluster.is_master(heir), what="the replica promoted")
        wait_for(lambda: cluster.state_ok(heir.port), what="the cluster healed")
        after = (
            wait_for(
                lambda: {c.context_id for c in queue.claim().claims} or None,
                what="the failed-over shards claimed",
            )
            if during != set(ids)
            else set()
        )
        assert during | after == set(ids) and not during & after
        assert victim_id != cluster.node_id(heir)
        client.close()


def test_a_planned_sentinel_failover_is_followed_by_the_same_client(
    tmp_path: Path, make_settings: Any
) -> None:
    """SENTINEL FAILOVER (maintenance): the old primary becomes a read-only replica; a client
    that still holds connections to it moves to the new primary instead of failing on READONLY."""
    with LocalSentinel(tmp_path / "sentinel") as deployment:
        settings: MemqSettings = make_settings(redis_url=deployment.url, storage="redis")
        client = redis_client(settings)
        storage = get_storage(settings, redis=client)
        storage.save("eve", None, MemoryDocument(facts=[Fact(content="before")]))
        old_port = deployment.master_port()
        with redis.Redis(port=deployment.sentinels[0].port, decode_responses=True) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", deployment.master_name)
        wait_for(lambda: deployment.master_port() != old_port, what="the switch")
        wait_for(lambda: replica_in_sync(old_port), what="the old primary as a replica")

        storage.update(
            "eve", None, lambda d: MemoryDocument(facts=[*d.facts, Fact(content="after")])
        )

        assert [f.content for f in storage.load("eve").facts] == ["before", "after"]
        client.close()


def test_a_planned_cluster_failover_is_followed_by_the_same_client(
    tmp_path: Path, make_settings: Any
) -> None:
    with LocalCluster(tmp_path / "cluster", masters=3, replicas=1) as cluster:
        settings: MemqSettings = make_settings(redis_url=cluster.url, storage="redis", shards=6)
        client = redis_client(settings)
        storage = get_storage(settings, redis=client)
        users = [f"v{n}" for n in range(12)]  # some on every master
        for user in users:
            storage.save(user, None, MemoryDocument(facts=[Fact(content="before")]))
        for replicas in cluster.replicas_of.values():  # one shard at a time, as maintenance does
            planned_failover(cluster, replicas[0])

        for user in users:
            storage.update(
                user, None, lambda d: MemoryDocument(facts=[*d.facts, Fact(content="after")])
            )

        for user in users:
            assert [f.content for f in storage.load(user).facts] == ["before", "after"]
        client.close()
