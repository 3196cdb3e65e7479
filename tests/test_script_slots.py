"""Every Lua script call memq makes touches keys of one hash slot, as the code builds them.

A client that computes the cluster slot (``redis.cluster.key_slot``) of each EVALSHA's KEYS runs
every queue, storage and erasure operation against a real redis-server with many shards; each
call must name exactly one slot, or Redis Cluster would refuse it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.scripts import assemble
from memq.local.redis_server import RedisServer
from producer.enqueue import Enqueuer, EnqueueRequest
from storage import Fence, get_storage
from storage.document import Fact, MemoryDocument
from storage.erasure import erase
from tests.support.started_queue import StartingQueue
from worker.batch_queue import BatchQueue, OutRequest

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000
SCRIPTS = {
    "producer": ["enqueue"],
    "worker": [
        "claim_due",
        "reap_expired",
        "complete",
        "fail",
        "renew",
        "release",
        "dead_retry",
        "dead_purge",
        "batch_park",
        "batch_submit",
        "batch_complete",
        "batch_fallback",
        "batch_unlock",
    ],
    "storage": ["save_document", "erase_contexts"],
}


def _sha(package: str, name: str) -> str:
    """The SHA the client registers: the script as assembled with its shared fragments."""
    text = assemble(package, name)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


NAMES = {_sha(package, name): name for package, names in SCRIPTS.items() for name in names}


def _note(calls: list[tuple[str, set[int]]], sha: str, numkeys: int, keys_and_args: Any) -> None:
    keys = keys_and_args[:numkeys]
    calls.append((NAMES.get(sha, sha), {key_slot(str(k).encode()) for k in keys}))


class SlotRecordingPipeline(redis.client.Pipeline):
    """A real pipeline that notes its script calls too (the storage sends its save in one)."""

    calls: list[tuple[str, set[int]]]

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:  # type: ignore[override]
        _note(self.calls, sha, numkeys, keys_and_args)
        return super().evalsha(sha, numkeys, *keys_and_args)


class SlotRecordingRedis(redis.Redis):
    """A real client that notes the slots of every script call's keys, on the client and in
    its pipelines alike (whether a script goes in a pipeline depends on whether Redis already
    holds it, so a test that left scripts loaded must not change what is seen)."""

    calls: list[tuple[str, set[int]]]

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:  # type: ignore[override]
        _note(self.calls, sha, numkeys, keys_and_args)
        return super().evalsha(sha, numkeys, *keys_and_args)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = SlotRecordingPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
        pipe.calls = self.calls
        return pipe


def test_every_script_call_touches_one_slot(redis_server: RedisServer, make_settings: Any) -> None:
    client = SlotRecordingRedis.from_url(redis_server.url, decode_responses=True)
    client.calls = []
    settings = make_settings(
        shards=64,
        storage="redis",
        debounce_seconds=60.0,
        max_delay_seconds=600.0,
        max_inflight_per_user=6400,
    )
    queue = StartingQueue(settings, client)
    storage = get_storage(settings, redis=client)
    enqueue = Enqueuer(
        client,
        KeySchema(settings.key_prefix, settings.shards),
        debounce_ms=settings.debounce_ms,
        max_delay_ms=settings.max_delay_ms,
    )

    def send(thread: str, user: str, agent: str | None, now: int) -> str:
        key = ContextKey.create(thread, user, agent)
        text = '[{"role":"user","content":"hi"},{"role":"assistant","content":"ok"}]'
        enqueue(EnqueueRequest(key=key, messages_json=text, flush=True), now)
        return key.id

    ids = [send(f"t{n}", f"user{n % 7}", ["a", "b", None][n % 3], T0) for n in range(40)]
    claims = {c.context_id: c for c in queue.claim(T0 + 1).claims}
    assert set(claims) == set(ids)
    first, second, third, fourth = ids[:4]
    assert queue.renew(first, claims[first].token, T0 + 2)
    key = ContextKey.from_id(first)
    storage.update(
        key.user_id,
        key.agent_name,
        lambda d: MemoryDocument(facts=[Fact(content="x")]),
        fence=Fence(first, claims[first].token),
    )
    queue.complete(first, claims[first].token, T0 + 3, watermark='["w"]')
    queue.release(second, claims[second].token, T0 + 3)
    queue.fail(third, claims[third].token, "PermanentLLMError: no", None, T0 + 3)
    queue.reap(T0 + 4 + settings.lease_ms)
    queue.dead_retry([third], T0 + 5 + settings.lease_ms)
    [again] = [c for c in queue.claim(T0 + 6 + settings.lease_ms).claims if c.context_id == third]
    queue.fail(third, again.token, "PermanentLLMError: no", None, T0 + 7 + settings.lease_ms)
    queue.dead_purge("all")
    # The batch lane: two contexts parked, gathered into one job, one settled, one sent back.
    batches = BatchQueue(settings.model_copy(update={"llm_batch_gather_seconds": 0.0}), client)
    later = T0 + 8 + settings.lease_ms
    fifth, sixth = send("tb1", "user1", "a", later), send("tb2", "user2", None, later)
    claims = {c.context_id: c for c in queue.claim(later + 1).claims}
    for parked in (fifth, sixth):
        assert batches.park(parked, claims[parked].token, '{"model":"m"}', '["w"]', "{}", T0 + 8)
    for context_id, batch_id in ((fifth, "batch_a"), (sixth, "batch_b")):
        shard = queue.keys.for_context(context_id)
        lock = batches.lock(shard, 1000)
        assert lock is not None
        found = [p for p in batches.gather(shard, T0 + 9) if p.context_id == context_id]
        assert batches.submit(shard, batch_id, found, T0 + 9) == 1
        batches.unlock(shard, lock)
    batches.complete(OutRequest(fifth, claims[fifth].token), "batch_a", '["w"]', T0 + 10)
    assert batches.fallback(OutRequest(sixth, claims[sixth].token), "batch_b", T0 + 10)
    erase(settings, client, storage, ContextKey.from_id(fourth).user_id)

    assert {name for name, _ in client.calls} == {n for names in SCRIPTS.values() for n in names}
    crossing = [(name, slots) for name, slots in client.calls if len(slots) != 1]
    assert crossing == []
    client.close()
