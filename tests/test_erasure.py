"""Erasure against a real redis-server: `forget` removes everything memq holds about a user.

The user has a memory document, a pending context, one in flight, one dead-lettered and a
watermark; afterwards no key in Redis holds their text or is named after them, the run in flight
can no longer save, another user is untouched, and a second forget finds nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from memq.core.errors import StaleClaim
from memq.testing.redis_dump import dump_redis
from storage import Fence
from storage.document import Fact, MemoryDocument
from storage.erasure import erase, erase_thread
from storage.sources import Source
from tests.support.world import T0, World
from worker.queue import CompleteResult

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", "file"])
def world(request: Any, make_settings: Any, redis_client: redis.Redis) -> World:
    settings = make_settings(storage=request.param, debounce_seconds=60.0, max_delay_seconds=600.0)
    return World(settings, redis_client)


def test_forget_removes_everything_of_the_user_and_fences_the_run_in_flight(
    world: World, redis_client: redis.Redis
) -> None:
    queue = world.queue
    world.remember("fay", "fay-doc-secret")
    world.remember("fay", "fay-agent-secret", agent="coder")
    # A finished run leaves a watermark behind.
    done = world.enqueue("t-done", "fay", "fay-done-secret", flush=True)
    [claim] = queue.claim(T0 + 1).claims
    assert queue.complete(done, claim.token, T0 + 2, watermark='["abc"]') is CompleteResult.DONE
    # One dead, one in flight, one pending.
    dead = world.enqueue("t-dead", "fay", "fay-dead-secret", flush=True, now=T0 + 3)
    [claim] = queue.claim(T0 + 4).claims
    queue.fail(dead, claim.token, "PermanentLLMError: bad request", None, T0 + 5)
    running = world.enqueue("t-run", "fay", "fay-run-secret", agent="coder", flush=True, now=T0 + 6)
    [in_flight] = queue.claim(T0 + 7).claims
    world.enqueue("t-wait", "fay", "fay-wait-secret", now=T0 + 8)
    # Someone else, who must keep everything.
    world.remember("gus", "gus-doc-keep")
    world.enqueue("t-gus", "gus", "gus-wait-keep", now=T0 + 9)
    assert queue.stats(T0 + 10)["dead"] == 1 and queue.stats(T0 + 10)["inflight"] == 1

    report = erase(world.settings, redis_client, world.storage, "fay")

    assert report.as_dict() == {
        "documents": 2,
        "pending": 1,
        "in_flight": 1,
        "dead": 1,
        "contexts": 3,
        "watermarks": 1,
        "user_sets": 2,
    }
    # The run in flight can no longer write the memory back, nor settle.
    with pytest.raises(StaleClaim):
        world.storage.update(
            "fay",
            "coder",
            lambda d: MemoryDocument(facts=[Fact(content="fay-late")]),
            fence=Fence(running, in_flight.token),
        )
    assert queue.complete(running, in_flight.token, T0 + 11) is CompleteResult.STALE
    assert world.storage.list_agents("fay") == []
    assert "fay" not in world.storage.list_users()
    # This test's keys only: the session's redis-server also holds other tests' users named fay.
    prefix = world.settings.key_prefix
    keyspace = {k: v for k, v in dump_redis(redis_client).items() if k.startswith(prefix)}
    assert not [k for k, v in keyspace.items() if "fay" in k or "fay-" in v]
    # Nothing of gus's went.
    assert [f.content for f in world.storage.load("gus").facts] == ["gus-doc-keep"]
    assert any("gus-wait-keep" in v for v in keyspace.values())
    # Idempotent.
    assert erase(world.settings, redis_client, world.storage, "fay").total == 0


def test_forget_works_for_a_user_with_only_queued_work(
    world: World, redis_client: redis.Redis
) -> None:
    world.enqueue("t1", "hal", "hal-wait-secret")
    report = erase(world.settings, redis_client, world.storage, "hal")
    assert (report.documents, report.pending, report.contexts) == (0, 1, 1)
    assert not [v for v in dump_redis(redis_client).values() if "hal-wait-secret" in v]


def test_erasing_one_agent_keeps_the_users_other_memories(
    world: World, redis_client: redis.Redis
) -> None:
    world.remember("ivy", "ivy-global")
    world.remember("ivy", "ivy-coder", agent="coder")
    world.enqueue("t1", "ivy", "ivy-coder-wait", agent="coder")
    world.enqueue("t2", "ivy", "ivy-global-wait")

    report = erase(world.settings, redis_client, world.storage, "ivy", agent_name="coder")

    assert (report.documents, report.pending, report.user_sets) == (1, 1, 0)
    assert world.storage.list_agents("ivy") == [None]
    values = dump_redis(redis_client).values()
    assert not [v for v in values if "ivy-coder-wait" in v]
    assert any("ivy-global-wait" in v for v in values)


def test_dead_letters_and_contexts_carry_their_retention(
    world: World, redis_client: redis.Redis
) -> None:
    queue, settings = world.queue, world.settings
    pending = world.enqueue("t1", "jo", "jo-text")
    ctx_key = queue.keys.for_context(pending).context(pending)
    ttl = redis_client.pttl(ctx_key)
    assert 0 < ttl <= settings.context_retention_ms
    dead = world.enqueue("t2", "jo", "jo-dead", flush=True)
    [claim] = queue.claim(T0 + 1).claims
    queue.fail(dead, claim.token, "PermanentLLMError: no", None, T0 + 2)
    dead_key = queue.keys.for_context(dead).context(dead)
    assert 0 < redis_client.pttl(dead_key) <= settings.dead_retention_ms
    [entry] = queue.dead_list()
    assert entry.expires_at_ms == T0 + 2 + settings.dead_retention_ms
    # The reaper drops dead ids past their retention (their hashes expire on their own).
    queue.reap(T0 + 3 + settings.dead_retention_ms)
    assert queue.dead_list() == []


THREAD = "auth0|abc:chat/1 \u2603"  # a real-looking id with the context id's separator in it


def learnt(content: str, *threads: str) -> Fact:
    sources = [Source(thread_id=t, run_id=f"run-{t}-{content}") for t in threads]
    return Fact(content=content, source_thread_id=threads[0], sources=sources)


def test_forget_a_thread_removes_its_facts_sources_and_queued_work_and_fences_its_run(
    world: World, redis_client: redis.Redis
) -> None:
    queue = world.queue
    world.storage.save(
        "kim",
        None,
        MemoryDocument(
            facts=[
                learnt("kim-thread-secret", THREAD),
                learnt("kim-shared-fact", "t-other", THREAD),
                Fact(content="kim-by-hand", source="manual"),
            ]
        ),
    )
    world.storage.save("kim", "coder", MemoryDocument(facts=[learnt("kim-coder-secret", THREAD)]))
    dead = world.enqueue(THREAD, "kim", "kim-dead-secret", flush=True)
    [claim] = queue.claim(T0 + 1).claims
    queue.fail(dead, claim.token, "PermanentLLMError: no", None, T0 + 2)
    running = world.enqueue(THREAD, "kim", "kim-run-secret", agent="coder", flush=True, now=T0 + 3)
    [in_flight] = queue.claim(T0 + 4).claims
    world.enqueue("t-other", "kim", "kim-other-keep", now=T0 + 5)

    report = erase_thread(world.settings, redis_client, world.storage, "kim", THREAD)

    assert (report.facts_removed, report.facts_trimmed, report.documents) == (2, 1, 2)
    assert (report.pending, report.in_flight, report.dead, report.contexts) == (0, 1, 1, 2)
    with pytest.raises(StaleClaim):
        world.storage.update(
            "kim",
            "coder",
            lambda d: MemoryDocument(facts=[Fact(content="kim-late")]),
            fence=Fence(running, in_flight.token),
        )
    facts = {f.content: f for f in world.storage.load("kim").facts}
    assert sorted(facts) == ["kim-by-hand", "kim-shared-fact"]
    shared = facts["kim-shared-fact"]
    assert [s.thread_id for s in shared.sources] == ["t-other"]
    assert shared.source_thread_id == "t-other"
    assert world.storage.load("kim", "coder").facts == []
    values = "\n".join(dump_redis(redis_client).values())
    assert "kim-thread-secret" not in values and "kim-dead-secret" not in values
    assert "kim-run-secret" not in values and "kim-coder-secret" not in values
    assert "kim-other-keep" in values  # another thread's pending turn stays
    assert queue.stats(T0 + 6)["due"] == 1
    again = erase_thread(world.settings, redis_client, world.storage, "kim", THREAD)
    assert (again.facts_removed, again.contexts, again.documents) == (0, 0, 0)
