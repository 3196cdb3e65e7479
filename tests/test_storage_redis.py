"""RedisMemoryStorage on a real redis-server, what only it does: key names, CAS retries, data
written by others (the shared contract is tests/test_storage_contract.py)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from memq.core.errors import CorruptMemoryFile, InvalidIdentifier
from memq.core.keys import KeySchema
from storage import get_storage
from storage.document import Fact, MemoryDocument
from storage.history import parse_document
from storage.redis_store import RedisMemoryStorage
from tests.support.documents import DEERFLOW_MEMORY_JSON, contents, doc_with

pytestmark = pytest.mark.integration


@pytest.fixture
def store(make_settings: Any, redis_client: redis.Redis) -> RedisMemoryStorage:
    storage = get_storage(make_settings(storage="redis"), redis=redis_client)
    assert isinstance(storage, RedisMemoryStorage)
    return storage


def test_round_trip_and_keys_from_the_schema(
    store: RedisMemoryStorage, redis_client: redis.Redis, key_prefix: str
) -> None:
    store.save("alice", "Coder", doc_with("Uses vim"))

    key = KeySchema(key_prefix).memory_document("alice", "coder")
    stored = redis_client.hgetall(key)
    assert stored["rev"] == "1"
    assert contents(parse_document(stored["doc"])) == ["Uses vim"]
    loaded = store.load("alice", "coder")
    assert contents(loaded) == ["Uses vim"] and loaded.last_updated is not None


def test_identifiers_cannot_inject_into_key_names(store: RedisMemoryStorage) -> None:
    pairs = [("a}:x", None), ("alice", "{evil}"), ("a b", None), ("alice@example.com", "x.y")]
    for user, agent in pairs:
        store.save(user, agent, doc_with(f"{user} {agent}"))
        key = store.keys.memory_document(user, agent)
        assert key.count("{") == 1 and key.count("}") == 1
    for user, agent in pairs:
        assert [f.content for f in store.load(user, agent).facts] == [f"{user} {agent}"]
    assert set(store.list_users()) == {"a}:x", "alice", "a b", "alice@example.com"}
    assert store.list_agents("alice") == ["{evil}"]
    for bad in ("", "a\x00b", "\ud800"):
        with pytest.raises(InvalidIdentifier):
            store.save(bad, None, doc_with("x"))


def test_reads_a_deerflow_document_saved_as_is(
    store: RedisMemoryStorage, redis_client: redis.Redis, key_prefix: str
) -> None:
    key = KeySchema(key_prefix).memory_document("alice", None)
    redis_client.hset(key, mapping={"doc": DEERFLOW_MEMORY_JSON, "rev": 1})
    document = store.load("alice")
    assert [f.id for f in document.facts] == ["fact_3f9a1c2e", "fact_77b0d4aa", "fact_0c1d2e3f"]
    assert document.facts[0].source_thread_id == "thread-42"


def test_update_retries_on_a_concurrent_write_and_keeps_both(store: RedisMemoryStorage) -> None:
    store.save("alice", None, doc_with("first"))
    calls: list[int] = []

    def add_mine(document: MemoryDocument) -> MemoryDocument:
        calls.append(len(document.facts))
        if len(calls) == 1:  # another worker writes between our read and our write
            store.save("alice", None, doc_with("first", "theirs"))
        document.facts.append(Fact(content="mine"))
        return document

    result = store.update("alice", None, add_mine)
    assert calls == [1, 2]  # called again on the newer document
    assert contents(result) == ["first", "theirs", "mine"]
    assert contents(store.load("alice")) == ["first", "theirs", "mine"]


def test_corrupt_document_raises_and_update_refuses_to_overwrite(
    store: RedisMemoryStorage, redis_client: redis.Redis, key_prefix: str
) -> None:
    key = KeySchema(key_prefix).memory_document("alice", None)
    redis_client.hset(key, mapping={"doc": '{"facts": [', "rev": 3})
    with pytest.raises(CorruptMemoryFile):
        store.load("alice")
    with pytest.raises(CorruptMemoryFile):
        store.update("alice", None, lambda d: doc_with("would erase"))
    assert redis_client.hget(key, "doc") == '{"facts": ['


def test_a_kept_parse_never_outlives_the_text_it_came_from(
    store: RedisMemoryStorage, make_settings: Any, redis_client: redis.Redis
) -> None:
    # A reader keeps the parsed document of the text it read; another process's writes, a forget
    # and a change made to what a load returned must all show on the next read.
    other = get_storage(make_settings(storage="redis"), redis=redis_client)
    other.save("alice", None, doc_with("Uses vim"))
    first = store.load("alice")
    assert contents(first) == ["Uses vim"]
    first.facts.append(Fact(content="changed in place by a caller", confidence=0.5))
    assert contents(store.load("alice")) == ["Uses vim"]
    other.save("alice", None, doc_with("Uses emacs"))
    assert contents(store.load("alice")) == ["Uses emacs"]
    other.delete("alice", None)
    assert contents(store.load("alice")) == []
    other.save("alice", None, doc_with("Uses nano"))  # recreated: its revision starts again
    assert contents(store.load("alice")) == ["Uses nano"]


def _counted_store(make_settings: Any, proxy: Any) -> RedisMemoryStorage:
    """A store whose every call goes through the counting proxy (its scripts already loaded)."""
    client = redis.Redis.from_url(proxy.url, decode_responses=True)
    storage = get_storage(make_settings(storage="redis"), redis=client)
    assert isinstance(storage, RedisMemoryStorage)
    return storage


def _proxy(redis_server: Any, redis_client: redis.Redis) -> Any:
    from bench.round_trips import CountingProxy, script_names
    from memq.core.scripts import assemble

    source = assemble("storage", "save_document")
    redis_client.script_load(source)  # a warm process: the script is loaded
    return CountingProxy(redis_server.port, script_names([("save", source)]))


def test_an_update_after_a_read_does_not_read_the_document_again(
    make_settings: Any, redis_server: Any, redis_client: redis.Redis
) -> None:
    """A worker reads the memory for its prompt, then applies the answer: the save's
    compare-and-set checks that the document is still the one read (counted on the wire)."""
    other = get_storage(make_settings(storage="redis"), redis=redis_client)
    other.save("alice", None, doc_with("Uses vim"))
    with _proxy(redis_server, redis_client) as proxy:
        store = _counted_store(make_settings, proxy)
        assert contents(store.load("alice")) == ["Uses vim"]
        store.update("alice", None, lambda d: doc_with(*contents(d), "Ships in Go"))
        _, counts = proxy.snapshot()
    assert counts["HMGET"] == 1, counts
    assert counts["SADD + script save"] == 1, counts
    assert contents(other.load("alice")) == ["Uses vim", "Ships in Go"]


def test_a_refused_save_carries_the_newer_document_to_apply_again(
    make_settings: Any, redis_server: Any, redis_client: redis.Redis
) -> None:
    other = get_storage(make_settings(storage="redis"), redis=redis_client)
    other.save("alice", None, doc_with("Uses vim"))
    with _proxy(redis_server, redis_client) as proxy:
        store = _counted_store(make_settings, proxy)
        store.load("alice")
        other.save("alice", None, doc_with("Uses vim", "theirs"))  # saved since our read
        seen: list[list[str]] = []

        def add_mine(document: MemoryDocument) -> MemoryDocument:
            seen.append(contents(document))
            return doc_with(*contents(document), "mine")

        store.update("alice", None, add_mine)
        _, counts = proxy.snapshot()
    assert seen == [["Uses vim"], ["Uses vim", "theirs"]]
    assert counts["HMGET"] == 1 and counts["SADD + script save"] == 2, counts
    assert contents(other.load("alice")) == ["Uses vim", "theirs", "mine"]


def test_a_document_forgotten_and_created_again_since_it_was_read_is_never_overwritten(
    store: RedisMemoryStorage, make_settings: Any, redis_client: redis.Redis
) -> None:
    """Its revision starts again at 1, as the one read: the save must still see that it is not
    the same document, or what was forgotten would come back with this run's change."""
    other = get_storage(make_settings(storage="redis"), redis=redis_client)
    other.save("alice", None, doc_with("Lives in Lisbon"))
    assert contents(store.load("alice")) == ["Lives in Lisbon"]
    other.delete("alice", None)
    other.save("alice", None, doc_with("Uses nano"))
    key = store.keys.memory_document("alice", None)
    assert redis_client.hget(key, "rev") == "1"  # the revision the store read, again
    store.update("alice", None, lambda d: doc_with(*contents(d), "Ships in Go"))
    assert contents(store.load("alice")) == ["Uses nano", "Ships in Go"]


def test_a_no_op_judged_on_an_old_read_is_judged_again_on_the_latest(
    store: RedisMemoryStorage, make_settings: Any, redis_client: redis.Redis
) -> None:
    other = get_storage(make_settings(storage="redis"), redis=redis_client)
    other.save("alice", None, doc_with("Uses vim"))
    store.load("alice")
    other.save("alice", None, doc_with("Uses vim", "Uses Go"))

    def drop_go(document: MemoryDocument) -> MemoryDocument:
        document.facts = [f for f in document.facts if f.content != "Uses Go"]
        return document

    store.update("alice", None, drop_go)  # nothing to drop in the old read; one in the latest
    assert contents(store.load("alice")) == ["Uses vim"]
