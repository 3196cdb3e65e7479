"""The worker side of the Redis queue contract, against a real redis-server.

Contexts are enqueued with the producer's own enqueue.lua (the other half of the contract), and
time is passed explicitly (epoch ms), so leases and deadlines are tested without waiting.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any, cast

import pytest
import redis

from memq.core.identity import ContextKey, encode_user
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from producer.enqueue import Enqueuer as ProducerEnqueuer
from producer.enqueue import EnqueueRequest
from prompts.answer import parse_update_response
from tests.support.started_queue import StartingQueue
from worker.queue import Claim, CompleteResult, FailResult, QueueClient, ReapResult
from worker.runtime import WorkerRuntime
from worker.tasks import extract
from worker.tick import run_tick

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000  # a fixed "now", epoch ms


class Enqueuer:
    """Enqueues through the producer's own enqueue client (the other half of the contract), so
    these tests can never drift from what the producer sends."""

    def __init__(self, settings: MemqSettings, client: redis.Redis) -> None:
        self.settings = settings
        self.client = client
        self._enqueue = ProducerEnqueuer(
            client,
            KeySchema(settings.key_prefix, settings.shards),
            debounce_ms=settings.debounce_ms,
            max_delay_ms=settings.max_delay_ms,
            retention_ms=settings.context_retention_ms,
        )

    def __call__(
        self,
        thread: str,
        now: int,
        *,
        flush: bool = False,
        text: str = "hi",
        user: str = "alice",
    ) -> str:
        key = ContextKey.create(thread, user, None)
        messages = json.dumps([{"role": "user", "content": text}])
        self._enqueue(EnqueueRequest(key=key, messages_json=messages, flush=flush), now)
        return key.id


@pytest.fixture
def qsettings(make_settings: Any) -> MemqSettings:
    return make_settings(  # type: ignore[no-any-return]
        debounce_seconds=1.0, max_delay_seconds=10.0, lease_seconds=60.0, max_attempts=3
    )


@pytest.fixture
def queue(qsettings: MemqSettings, redis_client: redis.Redis) -> StartingQueue:
    return StartingQueue(qsettings, redis_client)


@pytest.fixture
def enqueue(qsettings: MemqSettings, redis_client: redis.Redis) -> Enqueuer:
    return Enqueuer(qsettings, redis_client)


def members(client: redis.Redis, zset: str) -> dict[str, float]:
    return dict(cast("list[tuple[str, float]]", client.zrange(zset, 0, -1, withscores=True)))


def test_claim_takes_only_due_keys_and_leases_them(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    due_id = enqueue("t-due", T0, flush=True)
    later_id = enqueue("t-later", T0)  # debounced: due at T0 + 1 s

    batch = queue.claim(T0)

    assert [c.context_id for c in batch.claims] == [due_id]
    claim = batch.claims[0]
    assert queue.claimed_version(due_id) == 1
    q = queue.keys.for_context(due_id)
    assert members(redis_client, q.inflight) == {due_id: T0 + 60_000}
    assert members(redis_client, q.due) == {later_id: T0 + 1_000}
    stored = queue.load(due_id)
    assert stored["claim_token"] == claim.token
    assert stored["claimed_version"] == "1"
    assert queue.claim(T0 + 10).claims == []  # never claimed twice while in flight


def test_each_claim_of_one_call_holds_the_token_its_hash_was_given(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    """The script returns the first token once; each claim's token must still be the one its
    context's hash holds, distinct, and each settles only its own context."""
    ids = [enqueue(f"t-{n}/x%y.z", T0, flush=True) for n in range(5)]
    batch = queue.claim(T0)
    assert sorted(c.context_id for c in batch.claims) == sorted(ids)
    tokens = {c.context_id: c.token for c in batch.claims}
    assert len(set(tokens.values())) == 5
    for context_id, token in tokens.items():
        assert queue.load(context_id)["claim_token"] == token
    other = batch.claims[0]
    for claim in batch.claims[1:]:
        assert queue.complete(other.context_id, claim.token, T0 + 5) is CompleteResult.STALE
    assert all(
        queue.complete(c.context_id, c.token, T0 + 5) is CompleteResult.DONE for c in batch.claims
    )


def test_complete_deletes_the_context_when_its_version_did_not_move(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    cid = enqueue("t1", T0, flush=True)
    claim = queue.claim(T0).claims[0]

    assert queue.complete(cid, claim.token, T0 + 5) is CompleteResult.DONE

    q = queue.keys.for_context(cid)
    assert queue.load(cid) == {}
    assert members(redis_client, q.inflight) == {}
    assert members(redis_client, q.due) == {}


def test_enqueue_during_a_run_is_rescheduled_and_run_again(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    cid = enqueue("t1", T0, flush=True, text="first")
    first = queue.claim(T0).claims[0]
    enqueue("t1", T0 + 100, text="second")  # arrives while the worker runs
    q = queue.keys.for_context(cid)
    assert members(redis_client, q.due) == {}  # the running claim is not raced

    assert queue.complete(cid, first.token, T0 + 200) is CompleteResult.RESCHEDULED
    # A fresh debounce window from the enqueue, not the old (past) deadline.
    assert members(redis_client, q.due) == {cid: T0 + 100 + 1_000}
    assert queue.claim(T0 + 500).claims == []

    second = queue.claim(T0 + 1_100).claims[0]
    assert queue.claimed_version(cid) == 2
    # "first" stays with "second" (accumulated); the watermark keeps it from being re-extracted.
    contents = [m["content"] for m in json.loads(queue.load(cid)["messages"])]
    assert contents[-1] == "second"
    assert queue.complete(cid, second.token, T0 + 1_200) is CompleteResult.DONE
    assert queue.load(cid) == {}


def test_the_first_turn_after_a_claim_starts_the_next_max_delay_window(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    """A thread that talks through a run: the cap counts from the first turn after the claim,
    not from the first turn of the window the claim took (debounce 1 s, max delay 10 s)."""
    cid = enqueue("t1", T0, text="before")
    claim = queue.claim(T0 + 1_000).claims[0]
    for n, at in enumerate(range(T0 + 1_050, T0 + 11_000, 900)):  # never quiet for 1 s
        enqueue("t1", at, text=f"during {n}")
    assert queue.complete(cid, claim.token, T0 + 11_000) is CompleteResult.RESCHEDULED
    q = queue.keys.for_context(cid)
    assert members(redis_client, q.due) == {cid: T0 + 1_050 + 10_000}


def test_a_partial_run_with_no_new_turn_is_due_again_at_once(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    """``more``: the run extracted part of the messages; nothing arrived during it, so no
    deadline is stored since the claim, and the rest is due at the settlement's time."""
    cid = enqueue("t1", T0)
    claim = queue.claim(T0 + 1_000).claims[0]
    assert queue.complete(cid, claim.token, T0 + 1_500, more=True) is CompleteResult.RESCHEDULED
    q = queue.keys.for_context(cid)
    assert members(redis_client, q.due) == {cid: T0 + 1_500}
    assert queue.claim(T0 + 1_500).claims
    assert queue.claimed_version(cid) == 1


def test_a_stale_token_cannot_complete_fail_or_renew(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    cid = enqueue("t1", T0, flush=True)
    old = queue.claim(T0).claims[0]
    reaped = queue.reap(T0 + 60_001)  # the lease expired: the worker is presumed dead
    assert reaped.requeued == 1
    new = queue.claim(T0 + 60_002).claims[0]
    assert new.token != old.token

    assert queue.complete(cid, old.token, T0 + 60_003) is CompleteResult.STALE
    assert queue.fail(cid, old.token, "boom", T0 + 70_000, T0 + 60_003) is FailResult.STALE
    assert queue.renew(cid, old.token, T0 + 60_003) is False
    assert queue.load(cid)["claim_token"] == new.token
    q = queue.keys.for_context(cid)
    assert cid in members(redis_client, q.inflight)
    assert queue.complete(cid, new.token, T0 + 60_004) is CompleteResult.DONE


def test_a_claim_writes_no_context_hash_and_its_run_starts_from_what_the_hash_holds_then(
    queue: StartingQueue, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    """claim_due.lua records the claim in `claims` only; the run's start (its first renew) writes
    the run's fields from the hash as it is then, so a flush that arrives between the claim and
    the start is this run's: claimed, synchronous, and done when the run completes."""
    cid = enqueue("t1", T0, text="first")
    before = queue.load(cid)
    q = queue.keys.for_context(cid)
    [claim] = QueueClient.claim(queue, T0 + 1_000).claims  # the ticker's claim alone
    assert queue.load(cid) == before  # not one field of the context's hash moved
    assert redis_client.hget(q.claims, cid) == claim.token
    assert members(redis_client, q.inflight) == {cid: T0 + 1_000 + 60_000}

    enqueue("t1", T0 + 1_100, flush=True, text="second")  # before the task starts
    data, _, renewed = queue.start_run(cid, claim.token, T0 + 1_200)
    assert renewed
    assert [m["content"] for m in json.loads(data["messages"])] == ["first", "second"]
    assert data["claim_token"] == data["started_token"] == claim.token
    assert (data["claimed_version"], data["claimed_sync"]) == ("2", "1")
    assert "urgent" not in data  # handed to this run
    assert (data["pending_since_ms"], data["deadline_ms"]) == ("", "")  # the window it took
    assert queue.complete(cid, claim.token, T0 + 1_300) is CompleteResult.DONE
    assert queue.load(cid) == {} and redis_client.hlen(q.claims) == 0


def test_a_claim_costs_the_same_calls_for_5_candidates_as_for_50(
    queue: StartingQueue, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    """No Redis call per candidate (INFO commandstats counts every call a script makes)."""
    for n in range(56):
        enqueue(f"t{n}", T0, flush=True, user=f"u{n % 7}")
    # The shard's first claim also lifts its token counter to the floor (one SET, once).
    assert len(QueueClient.claim(queue, T0, 1).claims) == 1
    calls = []
    for limit in (5, 50):
        redis_client.config_resetstat()
        assert len(QueueClient.claim(queue, T0, limit).claims) == limit
        stats = redis_client.info("commandstats")
        outside = ("evalsha", "script", "config", "info")  # the client's own, not the script's
        script = {k: v for k, v in stats.items() if k.removeprefix("cmdstat_") not in outside}
        calls.append(sum(v["calls"] for v in script.values()))
    assert calls[0] == calls[1] == 11, script.keys()


def test_a_run_whose_claim_was_reaped_before_it_started_never_starts(
    queue: StartingQueue, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    """A task that waited past its lease (its claim reaped and the context claimed again) finds
    another token in `claims`: its start does nothing, the new run's start works."""
    cid = enqueue("t1", T0, flush=True)
    old = QueueClient.claim(queue, T0).claims[0]
    assert queue.reap(T0 + 60_001).requeued == 1
    new = QueueClient.claim(queue, T0 + 60_002).claims[0]
    assert queue.renew(cid, old.token, T0 + 60_003) is False
    assert "claim_token" not in queue.load(cid)
    assert queue.release(cid, old.token, T0 + 60_003) is False
    assert queue.renew(cid, new.token, T0 + 60_004) is True
    assert queue.load(cid)["claim_token"] == new.token


def test_a_context_whose_hash_vanished_before_its_run_started_ends_its_claim_there(
    queue: StartingQueue, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    cid = enqueue("t1", T0, flush=True)
    claim = QueueClient.claim(queue, T0).claims[0]
    q = queue.keys.for_context(cid)
    redis_client.delete(q.context(cid))  # its retention passed
    assert queue.renew(cid, claim.token, T0 + 1) is False
    assert members(redis_client, q.inflight) == {} and members(redis_client, q.due) == {}
    assert redis_client.hlen(q.claims) == 0 and redis_client.hlen(q.user_leases) == 0
    assert queue.load(cid) == {}  # nothing re-created


def test_renew_extends_the_lease_so_the_reaper_leaves_it(
    queue: QueueClient, enqueue: Enqueuer
) -> None:
    cid = enqueue("t1", T0, flush=True)
    claim = queue.claim(T0).claims[0]
    assert queue.renew(cid, claim.token, T0 + 50_000) is True
    assert queue.reap(T0 + 60_001).requeued == 0
    assert queue.complete(cid, claim.token, T0 + 60_002) is CompleteResult.DONE


def test_expired_leases_count_attempts_and_end_in_dead(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    cid = enqueue("t1", T0, flush=True)
    q = queue.keys.for_context(cid)
    now = T0
    for attempt in (1, 2):
        (claim,) = queue.claim(now).claims
        assert queue.renew(cid, claim.token, now)  # the run started (its first renew)
        now += 60_001
        assert queue.reap(now).requeued == 1
        assert queue.load(cid)["attempts"] == str(attempt)
        assert members(redis_client, q.due) == {cid: now}  # due again at once
    (claim,) = queue.claim(now).claims
    queue.renew(cid, claim.token, now)
    now += 60_001
    assert queue.reap(now).dead == 1  # max_attempts = 3

    assert members(redis_client, q.dead) == {cid: now}
    assert members(redis_client, q.due) == {} and members(redis_client, q.inflight) == {}
    [entry] = queue.dead_list()
    assert (entry.context_id, entry.attempts, entry.last_error) == (cid, 3, "lease expired")


def test_a_claim_whose_task_never_started_is_requeued_without_an_attempt(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    # Celery drops a task that waited in a broker backlog past its `expires` (= the lease): the
    # run never begins, so its expired lease must not count — else the context dies untried.
    cid = enqueue("t1", T0, flush=True)
    q = queue.keys.for_context(cid)
    now = T0
    for _ in range(5):  # max_attempts = 3
        assert len(QueueClient.claim(queue, now).claims) == 1  # a bare claim: no run starts
        now += 60_001
        assert queue.reap(now) == ReapResult(requeued=1, dead=0)
        assert members(redis_client, q.due) == {cid: now}
    stored = queue.load(cid)
    assert stored.get("attempts", "0") == "0" and "last_error" not in stored
    assert queue.dead_list() == []
    (claim,) = queue.claim(now).claims
    assert queue.complete(cid, claim.token, now + 1) is CompleteResult.DONE  # and it still runs


def test_a_claim_that_never_started_keeps_the_attempts_of_earlier_failures(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    # Two runs failed on the same version; a third claim's task is dropped by the broker before
    # it starts. No turn arrived, so the failures still count: the next failure dead-letters it
    # (max_attempts = 3), not three more.
    cid = enqueue("t1", T0, flush=True)
    q = queue.keys.for_context(cid)
    now = T0
    for _ in range(2):
        (claim,) = queue.claim(now).claims
        assert queue.fail(cid, claim.token, "timeout", now + 1, now) is FailResult.RETRY
        now += 1_000
    assert queue.load(cid)["attempts"] == "2"
    assert len(QueueClient.claim(queue, now).claims) == 1  # a bare claim: no run starts
    now += 60_001
    assert queue.reap(now) == ReapResult(requeued=1, dead=0)
    assert queue.load(cid)["attempts"] == "2"
    (claim,) = queue.claim(now).claims
    assert queue.fail(cid, claim.token, "timeout", now + 1, now) is FailResult.DEAD
    assert set(members(redis_client, q.dead)) == {cid}


def test_a_failure_never_dead_letters_messages_that_arrived_during_the_run(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    cid = enqueue("t1", T0, flush=True, text="v1")
    q = queue.keys.for_context(cid)
    claim = queue.claim(T0).claims[0]
    enqueue("t1", T0 + 100, text="v2")  # debounced: due at T0 + 1_100
    # A permanent error on v1's prompt: v2 never had its try, so it is due at its own deadline.
    assert queue.fail(cid, claim.token, "PermanentLLMError: 400", None, T0 + 200) is (
        FailResult.RETRY
    )
    assert members(redis_client, q.due) == {cid: T0 + 1_100} and members(redis_client, q.dead) == {}
    assert queue.load(cid)["attempts"] == "0"

    # At max_attempts - 1 (a transient error twice), v3 arrives during the third run.
    for now in (T0 + 1_100, T0 + 2_000):
        claim = queue.claim(now).claims[0]
        assert queue.fail(cid, claim.token, "timeout", now + 900, now) is FailResult.RETRY
    claim = queue.claim(T0 + 3_000).claims[0]
    enqueue("t1", T0 + 3_100, text="v3")
    assert queue.fail(cid, claim.token, "timeout", T0 + 4_000, T0 + 3_200) is FailResult.RETRY
    assert members(redis_client, q.due) == {cid: T0 + 4_000}
    stored = queue.load(cid)
    assert (stored["attempts"], stored["deadline_ms"]) == ("0", str(T0 + 4_000))
    assert queue.claim(T0 + 4_000).claims
    assert queue.claimed_version(cid) == 3


def test_a_reaped_run_never_dead_letters_messages_that_arrived_during_it(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    cid = enqueue("t1", T0, flush=True)
    q = queue.keys.for_context(cid)
    now = T0
    for _ in range(2):  # two runs that started and died: attempts = max_attempts - 1
        claim = queue.claim(now).claims[0]
        queue.renew(cid, claim.token, now)
        now += 60_001
        queue.reap(now)
    claim = queue.claim(now).claims[0]
    queue.renew(cid, claim.token, now)
    enqueue("t1", now + 100, text="new facts")  # arrives, then the worker dies too
    now += 60_001
    assert queue.reap(now) == ReapResult(requeued=1, dead=0)
    assert members(redis_client, q.due) == {cid: now} and members(redis_client, q.dead) == {}
    stored = queue.load(cid)
    assert (stored["attempts"], stored["deadline_ms"]) == ("0", str(now))
    assert queue.claim(now).claims
    assert queue.claimed_version(cid) == 2


def test_a_batch_beyond_luas_unpack_limit_is_claimed_whole(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    # 4200 claims are 8400 values in one ZADD: past Lua 5.1's unpack limit (~8000), which used to
    # fail the script after it had already removed the ids from `due`.
    settings = make_settings(max_inflight=10_000, max_inflight_per_user=10_000)
    queue, enqueue = StartingQueue(settings, redis_client), Enqueuer(settings, redis_client)
    for i in range(4_200):
        enqueue(f"t{i}", T0, flush=True)

    batch = queue.claim(T0, limit=4_200)

    assert len(batch.claims) == 4_200
    stats = queue.stats(T0)
    assert (stats["due"], stats["inflight"]) == (0, 4_200)
    with pytest.raises(ValueError, match="claim_batch"):
        make_settings(claim_batch=1_001)  # a tick's batch stays far below that


def test_fail_retries_at_the_given_time_then_dead_letters(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    cid = enqueue("t1", T0, flush=True)
    q = queue.keys.for_context(cid)
    claim = queue.claim(T0).claims[0]
    assert queue.fail(cid, claim.token, "timeout", T0 + 5_000, T0 + 10) is FailResult.RETRY
    assert members(redis_client, q.due) == {cid: T0 + 5_000}
    assert queue.claim(T0 + 4_999).claims == []

    claim = queue.claim(T0 + 5_000).claims[0]
    assert queue.fail(cid, claim.token, "auth failed", None, T0 + 5_010) is FailResult.DEAD
    assert members(redis_client, q.dead) == {cid: T0 + 5_010}
    assert queue.load(cid)["last_error"] == "auth failed"
    assert queue.stats(T0 + 5_010)["dead"] == 1


def test_dead_retry_and_purge(queue: QueueClient, enqueue: Enqueuer) -> None:
    ids = [enqueue(f"t{i}", T0, flush=True) for i in range(3)]
    for claim in queue.claim(T0).claims:
        queue.fail(claim.context_id, claim.token, "bad request", None, T0 + 1)
    assert sorted(e.context_id for e in queue.dead_list()) == sorted(ids)

    assert queue.dead_retry([ids[0]], T0 + 2) == 1
    assert queue.load(ids[0])["attempts"] == "0"
    assert [c.context_id for c in queue.claim(T0 + 2).claims] == [ids[0]]
    assert queue.dead_retry([ids[0]], T0 + 3) == 0  # not dead any more: left alone

    assert queue.dead_purge([ids[1]]) == 1
    assert queue.load(ids[1]) == {}
    assert queue.dead_purge("all") == 1
    assert queue.load(ids[2]) == {}
    assert queue.dead_list() == []
    assert queue.load(ids[0]) != {}  # the retried one survives a purge of "all"


def test_an_enqueue_revives_a_dead_context(queue: QueueClient, enqueue: Enqueuer) -> None:
    cid = enqueue("t1", T0, flush=True)
    claim = queue.claim(T0).claims[0]
    queue.fail(cid, claim.token, "bad request", None, T0 + 1)
    enqueue("t1", T0 + 10, flush=True, text="new messages")
    assert queue.dead_list() == []
    assert [c.context_id for c in queue.claim(T0 + 10).claims] == [cid]
    assert queue.claimed_version(cid) == 2


def test_orphans_whose_hash_vanished_are_cleaned(
    queue: QueueClient, redis_client: redis.Redis
) -> None:
    q = queue.keys.shard(0)
    redis_client.zadd(q.due, {"ghost:alice:": T0})
    redis_client.zadd(q.inflight, {"ghost2:alice:": T0})
    assert queue.claim(T0 + 1).claims == []
    assert queue.reap(T0 + 1).requeued == 0
    assert members(redis_client, q.due) == {} and members(redis_client, q.inflight) == {}


def test_a_member_that_is_no_context_id_is_cleaned_not_fatal(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    q = queue.keys.shard(0)
    cid = enqueue("t1", T0, flush=True)
    redis_client.zadd(q.due, {"junk": T0 - 1, "a:b{c}:d": T0 - 1})
    assert [c.context_id for c in queue.claim(T0).claims] == [cid]
    assert members(redis_client, q.due) == {}


def race_claims(queues: list[QueueClient], now: int) -> list[Claim]:
    """Every queue client claims in small batches from its own thread, all released at once."""
    claimed: list[Claim] = []
    lock = threading.Lock()
    start = threading.Barrier(len(queues))

    def tick(queue: QueueClient) -> None:
        start.wait(timeout=10)
        for _ in range(30):
            got = queue.claim(now, limit=7).claims
            with lock:
                claimed.extend(got)

    threads = [threading.Thread(target=tick, args=(q,)) for q in queues]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return claimed


def test_two_tickers_at_once_never_claim_a_version_twice(
    qsettings: MemqSettings, redis_server: Any, enqueue: Enqueuer
) -> None:
    clients = [redis.Redis.from_url(redis_server.url, decode_responses=True) for _ in range(4)]
    queues = [StartingQueue(qsettings, c) for c in clients]
    now = T0
    try:
        for round_no in range(5):
            ids = [
                enqueue(f"t{i}", now, flush=True, text=f"r{round_no}", user=f"u{i}")
                for i in range(60)
            ]
            claimed = race_claims(queues, now)
            counts = Counter(c.context_id for c in claimed)
            assert sorted(counts) == sorted(ids)  # every key claimed...
            assert max(counts.values()) == 1  # ...and none twice
            # Half the keys get new messages while in flight: each is claimed again, once.
            for claim in claimed[::2]:
                key = ContextKey.from_id(claim.context_id)
                enqueue(key.thread_id, now + 1, flush=True, text="more", user=key.user_id)
            for claim in claimed:
                queues[0].complete(claim.context_id, claim.token, now + 2)
            again = race_claims(queues, now + 2)
            assert Counter(c.context_id for c in again) == Counter(
                c.context_id for c in claimed[::2]
            )
            assert all(queues[0].claimed_version(c.context_id) == 2 for c in again)
            for claim in again:
                assert queues[0].complete(claim.context_id, claim.token, now + 3) is (
                    CompleteResult.DONE
                )
            now += 1_000
    finally:
        for client in clients:
            client.close()


def test_backpressure_stops_claiming_when_inflight_is_full(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings(max_inflight=5, claim_batch=3, debounce_seconds=1.0)
    queue = StartingQueue(settings, redis_client)
    enqueue = Enqueuer(settings, redis_client)
    for i in range(20):
        enqueue(f"t{i}", T0, flush=True)
    sent: list[Claim] = []

    report = run_tick(queue, sent.append, clock=lambda: T0)

    assert report.full and len(sent) == 5
    stats = queue.stats(T0)
    assert (stats["due"], stats["inflight"], stats["dead"], stats["oldest_due_lag_ms"]) == (
        15,
        5,
        0,
        0,
    )
    queue.complete(sent[0].context_id, sent[0].token, T0)
    again = run_tick(queue, sent.append, clock=lambda: T0)
    assert again.full and again.claimed == 1 and len(sent) == 6  # one slot freed, one claimed


def test_tick_drains_in_batches_and_releases_when_dispatch_fails(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings(claim_batch=4, debounce_seconds=1.0)
    queue = StartingQueue(settings, redis_client)
    enqueue = Enqueuer(settings, redis_client)
    ids = {enqueue(f"t{i}", T0, flush=True) for i in range(10)}

    def broken(claim: Claim) -> None:
        raise ConnectionError("broker down")

    report = run_tick(queue, broken, clock=lambda: T0)
    assert (report.claimed, report.dispatched, report.released) == (4, 0, 4)
    stats = queue.stats(T0 + 1)
    assert (stats["due"], stats["inflight"]) == (10, 0)
    assert all(queue.load(i).get("attempts", "0") == "0" for i in ids)  # no attempt counted

    sent: list[Claim] = []
    report = run_tick(queue, sent.append, clock=lambda: T0 + 1)
    assert report.rounds >= 3 and {c.context_id for c in sent} == ids


def test_one_claim_reaches_every_shard_even_after_redis_forgot_the_script(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    """Several shards: every shard's claim goes in one pipeline; a Redis that lost its scripts
    (restarted) answers each NOSCRIPT, and each is run again through the loader, once."""
    settings = make_settings(shards=4, debounce_seconds=1.0)
    queue, enqueue = StartingQueue(settings, redis_client), Enqueuer(settings, redis_client)
    ids = [enqueue(f"t{i}", T0, flush=True, user=f"u{i}") for i in range(12)]
    assert len({queue.keys.shard_of(i) for i in ids}) > 1
    redis_client.script_flush()

    batch = queue.claim(T0)

    assert sorted(c.context_id for c in batch.claims) == sorted(ids)
    assert batch.examined == 12
    assert queue.claim(T0 + 1).claims == []  # all in flight: claimed once


# --- fairness: the per-user in-flight cap


@pytest.fixture
def capped(make_settings: Any, redis_client: redis.Redis) -> tuple[QueueClient, Enqueuer]:
    settings = make_settings(
        debounce_seconds=1.0, lease_seconds=60.0, tick_seconds=0.5, max_inflight_per_user=2
    )
    return StartingQueue(settings, redis_client), Enqueuer(settings, redis_client)


def test_a_user_at_the_cap_is_not_claimed_but_another_user_is(
    capped: tuple[QueueClient, Enqueuer], redis_client: redis.Redis
) -> None:
    queue, enqueue = capped
    alice = [enqueue(f"a{i}", T0 + i, flush=True) for i in range(4)]
    bob = enqueue("b0", T0 + 10, flush=True, user="bob")  # due after all of alice's

    batch = queue.claim(T0 + 10, limit=4)  # the batch holds only alice's keys

    assert [c.context_id for c in batch.claims] == alice[:2]
    assert batch.deferred == 2
    q = queue.keys.shard(0)
    # Moved back behind bob, one tick and then queued behind each other (2 x the cap per tick),
    # and nothing lost; the hash keeps the real deadline.
    assert members(redis_client, q.due) == {bob: T0 + 10, alice[2]: T0 + 510, alice[3]: T0 + 635}
    assert queue.load(alice[2])["deadline_ms"] == str(T0 + 2)
    assert members(redis_client, q.inflight) == dict.fromkeys(alice[:2], T0 + 10 + 60_000)
    leases = redis_client.hgetall(q.user_leases)
    assert leases["alice"] == "2"
    assert float(leases["~alice"]) == T0 + 760  # where alice's next capped key would go

    assert [c.context_id for c in queue.claim(T0 + 11, limit=4).claims] == [bob]


def test_each_users_count_holds_every_lease_one_claim_gave_it(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    """One claim of one, two and three contexts of three users (one of them an id with `/`,
    `%`, `.` and `@`): each user's count holds them all (the per-user cap reads it on the next
    claim), under the user's key part as every other key names the user."""
    users = {"bob": 1, "carol": 2, "a/l%i.ce@x": 3}
    for user, count in users.items():
        for n in range(count):
            enqueue(f"t{n}", T0 + n, flush=True, user=user)
    batch = queue.claim(T0 + 10)
    assert len(batch.claims) == 6
    q = queue.keys.shard(0)
    assert redis_client.hgetall(q.user_leases) == {
        encode_user(user): str(count) for user, count in users.items()
    }
    for claim in batch.claims:
        assert queue.complete(claim.context_id, claim.token, T0 + 20) is CompleteResult.DONE
    assert redis_client.hgetall(q.user_leases) == {}  # nothing left once no lease is out


def test_a_capped_key_is_claimed_once_a_slot_frees(
    capped: tuple[QueueClient, Enqueuer], redis_client: redis.Redis
) -> None:
    queue, enqueue = capped
    ids = [enqueue(f"a{i}", T0, flush=True) for i in range(3)]
    first, _ = queue.claim(T0).claims
    assert queue.claim(T0 + 600).claims == []  # still at the cap: deferred again
    assert queue.complete(first.context_id, first.token, T0 + 700) is CompleteResult.DONE

    assert [c.context_id for c in queue.claim(T0 + 1_200).claims] == [ids[2]]


def test_a_new_turn_does_not_push_a_capped_flush_back(
    capped: tuple[QueueClient, Enqueuer], redis_client: redis.Redis
) -> None:
    queue, enqueue = capped
    ids = [enqueue(f"a{i}", T0, flush=True) for i in range(3)]
    queue.claim(T0)
    enqueue("a2", T0 + 100)  # a normal (debounced) turn on the deferred flush
    assert members(redis_client, queue.keys.shard(0).due) == {ids[2]: T0}  # still due at once


def test_a_lease_lost_with_its_worker_frees_its_users_slot_once_reaped(
    capped: tuple[QueueClient, Enqueuer], redis_client: redis.Redis
) -> None:
    queue, enqueue = capped
    lost = [enqueue(f"a{i}", T0, flush=True) for i in range(2)]
    assert [c.context_id for c in queue.claim(T0).claims] == lost  # their workers vanish
    cid = enqueue("a2", T0 + 1, flush=True)
    assert queue.claim(T0 + 1).claims == []  # two live leases: alice is at her cap

    # The tick reaps before it claims: the leases expire at T0 + 60 s.
    assert queue.reap(T0 + 60_000).requeued == 2
    assert redis_client.hget(queue.keys.shard(0).user_leases, "alice") is None
    claimed = [c.context_id for c in queue.claim(T0 + 60_000).claims]
    assert len(claimed) == 2 and set(claimed) <= {cid, *lost}


def test_a_claim_ended_twice_counts_its_user_down_once(
    queue: QueueClient, enqueue: Enqueuer, redis_client: redis.Redis
) -> None:
    """A claim ended by its complete and then again by a late release, fail and reap (each
    stale) leaves the user's count at its other leases: the count follows `inflight`, never
    below it."""
    first, second = enqueue("a0", T0, flush=True), enqueue("a1", T0, flush=True)
    one, two = queue.claim(T0).claims
    q = queue.keys.shard(0)
    assert redis_client.hget(q.user_leases, "alice") == "2"
    assert queue.complete(one.context_id, one.token, T0 + 1) is CompleteResult.DONE
    assert not queue.release(one.context_id, one.token, T0 + 2)
    assert queue.fail(one.context_id, one.token, "late", T0 + 10, T0 + 3) is FailResult.STALE
    assert queue.reap(T0 + 1_000_000).requeued == 1  # only the second's lease was out
    assert redis_client.hgetall(q.user_leases) == {}
    assert {first, second} >= {two.context_id}


@pytest.mark.parametrize("settle", ["complete", "fail", "release", "reap"])
def test_every_settlement_frees_the_users_slot(
    settle: str, make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings(debounce_seconds=1.0, lease_seconds=60.0, max_inflight_per_user=1)
    queue, enqueue = StartingQueue(settings, redis_client), Enqueuer(settings, redis_client)
    enqueue("a0", T0, flush=True)
    other = enqueue("a1", T0, flush=True)
    [claim] = queue.claim(T0).claims
    cid, now = claim.context_id, T0 + 1
    if settle == "complete":
        assert queue.complete(cid, claim.token, now) is CompleteResult.DONE
    elif settle == "fail":
        assert queue.fail(cid, claim.token, "timeout", T0 + 10**6, now) is FailResult.RETRY
    elif settle == "release":
        assert queue.release(cid, claim.token, T0 + 10**6)
    else:
        now = T0 + 60_000
        assert queue.reap(now).requeued == 1
    assert redis_client.hget(queue.keys.shard(0).user_leases, "alice") is None
    assert other in [c.context_id for c in queue.claim(max(now, T0 + 1_000)).claims]


def test_renew_moves_the_lease_and_keeps_the_users_count(
    capped: tuple[QueueClient, Enqueuer], redis_client: redis.Redis
) -> None:
    queue, enqueue = capped
    cid = enqueue("a0", T0, flush=True)
    claim = queue.claim(T0).claims[0]
    assert queue.renew(cid, claim.token, T0 + 30_000)
    assert queue.renew(cid, claim.token, T0 + 31_000)
    q = queue.keys.shard(0)
    assert members(redis_client, q.inflight) == {cid: T0 + 31_000 + 60_000}
    assert redis_client.hget(q.user_leases, "alice") == "1"


def test_a_tick_reaches_another_tenant_behind_a_wall_of_capped_keys(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings(debounce_seconds=1.0, claim_batch=3, max_inflight_per_user=2)
    queue, enqueue = StartingQueue(settings, redis_client), Enqueuer(settings, redis_client)
    for i in range(30):
        enqueue(f"a{i}", T0, flush=True)
    bob = enqueue("b0", T0 + 1, flush=True, user="bob")
    sent: list[Claim] = []

    # Two rounds would only ever see alice's keys; rounds that hit the cap do not count.
    report = run_tick(queue, sent.append, clock=lambda: T0 + 2, max_rounds=2)

    assert bob in [c.context_id for c in sent]
    assert len(sent) == 3 and report.deferred == 28
    assert queue.stats(T0 + 2)["due"] == 28  # nothing lost, all still waiting


# --- dead letters hold no user content


def test_a_parse_failure_is_dead_lettered_without_the_models_answer(
    make_settings: Any, redis_client: redis.Redis
) -> None:
    settings = make_settings(debounce_seconds=1.0, max_attempts=1)
    answer = "Sure! The user told me their passport number is X1234567 and lives at 5 Elm St."

    class Parrot:  # a pipeline whose model answered prose instead of the update object
        def pending_memory(self, context_id: str) -> None:
            return None

        def run(
            self,
            context: Any,
            *,
            watermark: str | None = None,
            fence: Any = None,
            gate: Any = None,
            memory: Any = None,
        ) -> Any:
            return parse_update_response(answer)

    runtime = WorkerRuntime(settings, pipeline_factory=lambda s, r: Parrot())  # type: ignore[arg-type,return-value]
    cid = Enqueuer(settings, redis_client)("t1", T0, flush=True)
    [claim] = runtime.queue.claim(T0).claims

    result = extract(runtime, cid, claim.token, clock=lambda: T0 + 1)

    assert result["queue"] == "dead"
    [entry] = runtime.queue.dead_list()
    assert entry.last_error.startswith("ResponseParseError: ")
    assert f"{len(answer)} chars" in entry.last_error  # its shape, to tell answers apart
    for word in ("passport", "X1234567", "Elm", "Sure"):
        assert word not in entry.last_error
